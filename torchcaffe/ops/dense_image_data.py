"""DenseImageData: image + label-image pairs for segmentation (SegNet's and ENet's forks)."""

from __future__ import annotations

import numpy as np

from ..data import cv
from ..data.listfile import read_text
from ..data.rng import CaffeRNG, for_rank
from ..data.transformer import DataTransformer
from ..errors import DataError, TorchCaffeError
from ..registry import register_layer
from ._data_source import BatchLoader, SourceLayer
from .base import Exactly


def read_pairs(source: str) -> list[tuple[str, str]]:
    """SegNet reads the list with ``infile >> image >> label``: whitespace-separated pairs."""
    tokens = read_text(source, "image/label list").split()
    pairs = list(zip(tokens[0::2], tokens[1::2]))
    if not pairs:
        raise DataError(
            "the image/label list is empty", path=source, expected="'image label' pairs"
        )
    return pairs


class DenseLoader(BatchLoader):
    """dense_image_data_layer.cpp's batch loop: read both images, random mirror and
    crop_height x crop_width crop applied to both, the image through the DataTransformer,
    the label image as raw values (``preserve_pixel_vals``)."""

    def __init__(self, p, transformer: DataTransformer, source: str) -> None:
        self.lines = read_pairs(source)
        self.root, self.source, self.transformer = p.root_folder, source, transformer
        self.batch_size = int(p.batch_size)
        self.flag = cv.IMREAD_COLOR if p.is_color else cv.IMREAD_GRAYSCALE
        self.new_hw = (int(p.new_height), int(p.new_width))
        self.divide = max(1, int(p.label_divide_factor))
        self.crop = (int(p.crop_height), int(p.crop_width))
        self.mirror, self.shuffle = bool(p.mirror), bool(p.shuffle)
        self.rng = CaffeRNG()
        if self.shuffle:
            self.rng.shuffle(self.lines)
        self.pos = 0

    def set_shard(self, rank: int, world_size: int) -> None:
        self.lines = self.lines[rank::world_size]
        if not self.lines:
            raise DataError("shard holds no lines", path=self.source)
        self.rng = for_rank(self.rng, rank)
        self.transformer.rng = for_rank(self.transformer.rng, rank)
        self.pos = 0

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        image_name, label_name = self.lines[i]
        img = cv.read(self.root + image_name, self.flag, source=self.source)
        lab = cv.read(self.root + label_name, cv.IMREAD_GRAYSCALE, source=self.source)
        h, w = self.new_hw
        if h > 0 and w > 0:
            img = cv.resize(img, h, w)
            m = cv.cv2()
            lab = m.resize(lab, (w // self.divide, h // self.divide), interpolation=m.INTER_NEAREST)
        return img, lab

    def item(self, img: np.ndarray, lab: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.mirror and self.rng.rand(2):
            img, lab = img[:, ::-1], lab[:, ::-1]
        ch, cw = self.crop
        if ch > 0 and cw > 0:
            if img.shape[0] < ch or img.shape[1] < cw:
                raise DataError(
                    "crop_height/crop_width larger than the image",
                    path=self.source,
                    expected=f">= {(ch, cw)}",
                    got=img.shape[:2],
                )
            h_off = self.rng.rand(img.shape[0] - ch + 1)
            w_off = self.rng.rand(img.shape[1] - cw + 1)
            img = img[h_off : h_off + ch, w_off : w_off + cw]
            lab = lab[h_off : h_off + ch, w_off : w_off + cw]
        return cv.hwc_to_chw(img), lab[None].astype(np.float32)

    def next_batch(self) -> list[np.ndarray]:
        data = labels = None
        for i in range(self.batch_size):
            img, lab = self.item(*self.pair(self.pos))
            if data is None or labels is None:
                data = np.empty(
                    (self.batch_size, *self.transformer.output_shape(img.shape)), np.float32
                )
                labels = np.empty((self.batch_size, *lab.shape), np.float32)
            self.transformer.transform_into(img, data[i])
            if lab.shape != labels.shape[1:]:
                raise DataError(
                    f"label image {self.lines[self.pos][1]!r} differs in size from the batch's",
                    path=self.source,
                    expected=labels.shape[1:],
                    got=lab.shape,
                )
            labels[i] = lab
            self.pos += 1
            if self.pos >= len(self.lines):
                self.pos = 0
                if self.shuffle:
                    self.rng.shuffle(self.lines)
        assert data is not None and labels is not None
        return [data, labels]


@register_layer("DenseImageData", fork="SegNet")
class DenseImageDataLayer(SourceLayer):
    """SegNet / ENet ``DenseImageData``, ``dense_image_data_param`` (source: ``image label``
    pairs, root_folder, batch_size, shuffle, rand_skip, new_height/new_width, is_color,
    mirror, crop_height/crop_width, label_divide_factor) and ``transform_param`` (scale and
    mean only: a random transform_param mirror/crop would separate image and label, which the
    forks refuse too).

    Tops: data (batch, C, H, W) and label (batch, 1, H, W), the label image's raw grey values.
    Images resize with INTER_LINEAR, labels with INTER_NEAREST (to new size /
    label_divide_factor, ENet). ``mirror`` and ``crop_*`` apply the same flip and window to
    both images. ``dense_image_data_param.mean_file`` is unused, as in the forks.
    """

    tops = Exactly(2)
    param_field = "dense_image_data_param"
    prefetch_depth = 3
    restrictions = (
        "mirror/crop/shuffle draw from an mt19937 seeded from torch's RNG, not the fork's "
        "caffe_rng_rand stream; ENet's multi_scale and separate root folders are not fields here"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        self._check_batch_size(p.batch_size)
        self._check_resize(p.new_height, p.new_width, p.is_color)
        if (p.crop_height > 0) != (p.crop_width > 0):
            raise self.error(
                "crop_height and crop_width must be set together", got=(p.crop_height, p.crop_width)
            )
        tp = layer_param.transform_param
        if tp.mirror or tp.crop_size:
            raise self.error(
                "transform_param mirror/crop_size would transform image and label differently",
                expected="dense_image_data_param mirror / crop_height / crop_width",
                got="transform_param mirror or crop_size",
            )
        if p.label_divide_factor > 1 and p.crop_height:
            raise self.error("crop is not applicable with label_divide_factor > 1")
        try:
            transformer = DataTransformer(tp, self.phase, where=p.source)
            loader = DenseLoader(p, transformer, p.source)
            if p.rand_skip:
                skip = CaffeRNG().rand(p.rand_skip)
                if skip >= len(loader.lines):
                    raise DataError(
                        "not enough lines to skip",
                        path=p.source,
                        expected=f"> {skip} lines",
                        got=len(loader.lines),
                    )
                loader.pos = skip
            img, lab = loader.pair(loader.pos)
            ch, cw = loader.crop
            if ch > 0:
                img, lab = img[:ch, :cw], lab[:ch, :cw]
            shape = transformer.output_shape(cv.hwc_to_chw(img).shape)
        except TorchCaffeError as err:
            raise err.located(layer=self.name, layer_type=self.caffe_type) from None
        self.loader = loader
        b = int(p.batch_size)
        self._top_shapes = [(b, *shape), (b, 1, *lab.shape[:2])]
