"""ImageData: images named in a list file, decoded and resized with OpenCV (Caffe's
ImageDataLayer)."""

from __future__ import annotations

import numpy as np

from ..data import cv
from ..data.listfile import read_list
from ..data.rng import CaffeRNG, for_rank
from ..data.transformer import DataTransformer
from ..errors import TorchCaffeError
from ..registry import register_layer
from ._data_source import BatchLoader, SourceLayer
from .base import Between


class ImageListLoader(BatchLoader):
    """ImageDataLayer::load_batch: lines in order (reshuffled at each wrap when shuffling),
    each image read as ReadImageToCVMat(root + name, new_height, new_width, is_color)."""

    def __init__(self, lines, root, new_hw, is_color, transformer, batch_size, shuffle, source):
        self.listed = list(lines)  # the list file's order
        self.lines, self.root, self.new_hw = list(lines), root, new_hw
        self.flag = cv.IMREAD_COLOR if is_color else cv.IMREAD_GRAYSCALE
        self.transformer, self.batch_size, self.source = transformer, batch_size, source
        self.rng = CaffeRNG() if shuffle else None
        if self.rng is not None:
            self.rng.shuffle(self.lines)
        self.pos = 0
        self.rank, self.world_size = 0, 1

    def set_shard(self, rank: int, world_size: int) -> None:
        """Caffe's ImageDataLayer has no Skip: every rank reads the whole list, from where
        rand_skip put it. Only the random streams are the rank's own: a shuffling rank reads
        the list in its own order (Caffe's solver r seeds with random_seed + r)."""
        if self.rng is not None and rank:
            self.rng = for_rank(self.rng, rank)
            self.lines = list(self.listed)
            self.rng.shuffle(self.lines)
        self.transformer.rng = for_rank(self.transformer.rng, rank)

    def image(self, i: int) -> np.ndarray:
        img = cv.read(self.root + self.lines[i][0], self.flag, source=self.source)
        if self.new_hw[0] > 0 and self.new_hw[1] > 0:
            img = cv.resize(img, *self.new_hw)
        return cv.hwc_to_chw(img)

    def next_batch(self) -> list[np.ndarray]:
        first = self.image(self.pos)
        shape = self.transformer.output_shape(first.shape)
        data = np.empty((self.batch_size, *shape), np.float32)
        labels = np.empty(self.batch_size, np.float32)
        for i in range(self.batch_size):
            img = first if i == 0 else self.image(self.pos)
            self.transformer.transform_into(img, data[i])
            labels[i] = self.lines[self.pos][1]
            self.pos += 1
            if self.pos >= len(self.lines):
                self.pos = 0
                if self.rng is not None:
                    self.rng.shuffle(self.lines)
        return [data, labels]


@register_layer("ImageData")
class ImageDataLayer(SourceLayer):
    """Images from a list file. Caffe type ``ImageData``, ``image_data_param`` (source,
    root_folder, batch_size, shuffle, new_height, new_width, is_color, rand_skip) and
    ``transform_param``.

    Each line is ``name label`` (split at the last space); ``root_folder`` is prepended
    verbatim. Tops: data (batch, C, H, W), label (batch,); the batch takes the shape of its
    first image. Lines wrap; with shuffle they are reshuffled at every wrap.
    """

    tops = Between(1, 2)
    param_field = "image_data_param"
    prefetch_depth = 3
    restrictions = (
        "shuffle, rand_skip and random mirror/crop draw from mt19937 streams seeded from "
        "torch's RNG (set_random_seed), not Caffe's global RNG: same distribution, another order"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        self._check_batch_size(p.batch_size)
        self._check_resize(p.new_height, p.new_width, p.is_color)
        try:
            lines = read_list(p.source)
            transformer = DataTransformer(layer_param.transform_param, self.phase, where=p.source)
            loader = ImageListLoader(
                lines,
                p.root_folder,
                (int(p.new_height), int(p.new_width)),
                bool(p.is_color),
                transformer,
                int(p.batch_size),
                bool(p.shuffle),
                p.source,
            )
            if p.rand_skip:
                skip = CaffeRNG().rand(p.rand_skip)
                if skip >= len(loader.lines):
                    raise self.error(
                        "rand_skip draw beyond the list",
                        expected=f"< {len(loader.lines)}",
                        got=skip,
                    )
                loader.pos = skip
            shape = transformer.output_shape(loader.image(loader.pos).shape)
        except TorchCaffeError as err:
            raise err.located(layer=self.name, layer_type=self.caffe_type) from None
        self.loader = loader
        self._top_shapes = [(int(p.batch_size), *shape), (int(p.batch_size),)][: self.num_tops]
