"""WindowData: R-CNN's foreground/background windows warped to crop_size (Caffe's
WindowDataLayer)."""

from __future__ import annotations

import math
import re

import numpy as np

from ..data import cv
from ..data.listfile import read_text
from ..data.rng import CaffeRNG, for_rank
from ..errors import DataError, TorchCaffeError
from ..formats.binaryproto import read_mean_file
from ..registry import register_layer
from ._data_source import BatchLoader, SourceLayer
from .base import Exactly

F = np.float32


def _round(x: np.float32) -> int:
    """C's round(): half away from zero."""
    return int(math.copysign(math.floor(abs(float(x)) + 0.5), float(x)))


def read_window_file(source: str, root: str, fg: float, bg: float):
    """-> (image paths, fg windows, bg windows); a window is (image, label, overlap, x1, y1,
    x2, y2). ``# index path channels height width count`` then ``count`` window lines."""
    text = read_text(source, "window file")
    found = list(re.finditer(r"\S+", text))  # Caffe reads it with >>: any whitespace
    tokens = [m.group() for m in found]
    if len(tokens) < 2:
        raise DataError("the window file is empty", path=source)
    images: list[str] = []
    fg_windows, bg_windows = [], []
    pos = 0
    try:
        while pos + 1 < len(tokens):
            if tokens[pos] != "#":
                raise DataError(
                    "malformed window file", path=source, expected="'#'", got=tokens[pos]
                )
            index = int(tokens[pos + 1])
            path, channels = tokens[pos + 2], int(tokens[pos + 3])
            if channels != 3:
                raise DataError(
                    f"image {path!r}: WindowData reads colour images",
                    path=source,
                    expected="3 channels",
                    got=channels,
                )
            count = int(tokens[pos + 6])
            pos += 7
            if index != len(images):
                raise DataError(
                    "image indices must count up from 0 (windows index the image list)",
                    path=source,
                    expected=len(images),
                    got=index,
                )
            images.append(root + path)
            for _ in range(count):
                # a float, as Caffe reads it: compared with the thresholds in float32 (numpy 1
                # would compare a Python float with a float32 in double)
                label, overlap = int(tokens[pos]), np.float32(tokens[pos + 1])
                box = [int(t) for t in tokens[pos + 2 : pos + 6]]
                if len(box) != 4:
                    raise IndexError("the last window line is cut short")
                pos += 6
                if overlap >= np.float32(fg):
                    if label <= 0:
                        raise DataError(
                            "a foreground window needs a label > 0", path=source, got=label
                        )
                    fg_windows.append((index, label, overlap, *box))
                elif overlap < np.float32(bg):
                    bg_windows.append((index, 0, 0.0, *box))
    except (IndexError, ValueError) as err:
        at = found[min(pos, len(found) - 1)].start()
        raise DataError(
            f"malformed window file at line {text.count(chr(10), 0, at) + 1} ({err})",
            path=source,
            expected="'# index path channels height width count', then count lines "
            "'label overlap x1 y1 x2 y2'",
        ) from None
    return images, fg_windows, bg_windows


class WindowLoader(BatchLoader):
    """window_data_layer.cpp load_batch: background samples first, then foreground ones."""

    def __init__(self, layer, p, tp) -> None:
        self.source = p.source
        self.images, self.fg, self.bg = read_window_file(
            p.source, p.root_folder, p.fg_threshold, p.bg_threshold
        )
        if not self.fg or not self.bg:
            raise DataError(
                "the window file needs foreground and background windows",
                path=p.source,
                got=f"{len(self.fg)} foreground, {len(self.bg)} background",
            )
        self.batch_size, self.scale = int(p.batch_size), F(p.scale)
        self.context_pad, self.square = int(p.context_pad), p.crop_mode == "square"
        self.fg_fraction = F(p.fg_fraction)
        self.crop, self.mirror = int(tp.crop_size), bool(tp.mirror)
        self.mean = None
        self.mean_values = np.asarray(tp.mean_value, F)
        if tp.HasField("mean_file"):
            if len(tp.mean_value):
                raise DataError("cannot specify mean_file and mean_value at the same time")
            try:
                mean = read_mean_file(tp.mean_file)
            except TorchCaffeError as err:
                raise DataError(f"cannot read mean_file {tp.mean_file!r}: {err}") from None
            self.mean = np.asarray(mean, F).reshape(-1, *mean.shape[-2:])
        if self.mean_values.size not in (0, 1, 3):
            raise DataError("specify either 1 mean_value or 3", got=self.mean_values.size)
        self.cache: dict[int, bytes] | None = {} if p.cache_images else None
        if self.cache is not None:
            for i, path in enumerate(self.images):
                try:
                    with open(path, "rb") as f:
                        self.cache[i] = f.read()
                except OSError as err:
                    raise DataError(
                        f"cannot open image {path!r} ({err.strerror})", path=self.source
                    ) from None
        self.rng = CaffeRNG()

    def set_shard(self, rank: int, world_size: int) -> None:
        """Windows are sampled, not read in order: each rank draws its own stream."""
        self.rng = for_rank(self.rng, rank)

    def image(self, index: int) -> np.ndarray:
        if self.cache is not None:
            return cv.decode(self.cache[index], cv.IMREAD_COLOR, source=self.images[index])
        return cv.read(self.images[index], cv.IMREAD_COLOR, source=self.source)

    def warp(self, window, do_mirror: bool) -> tuple[np.ndarray, int, int]:
        """The window's pixels warped to crop_size (with context padding), and pad_h, pad_w."""
        img = self.image(window[0])
        crop = self.crop
        x1, y1, x2, y2 = window[3:]
        out_w = out_h = crop
        pad_w = pad_h = 0
        if self.context_pad > 0 or self.square:
            context_scale = F(crop) / F(crop - 2 * self.context_pad)
            half_h, half_w = F((y2 - y1 + 1) / 2.0), F((x2 - x1 + 1) / 2.0)
            cx, cy = F(x1) + half_w, F(y1) + half_h
            if self.square:
                half_h = half_w = max(half_h, half_w)
            x1, x2 = _round(cx - half_w * context_scale), _round(cx + half_w * context_scale)
            y1, y2 = _round(cy - half_h * context_scale), _round(cy + half_h * context_scale)
            unclipped_h, unclipped_w = y2 - y1 + 1, x2 - x1 + 1
            pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
            pad_x2, pad_y2 = max(0, x2 - img.shape[1] + 1), max(0, y2 - img.shape[0] + 1)
            x1, x2, y1, y2 = x1 + pad_x1, x2 - pad_x2, y1 + pad_y1, y2 - pad_y2
            scale_x, scale_y = F(crop) / F(unclipped_w), F(crop) / F(unclipped_h)
            out_w = _round(F(x2 - x1 + 1) * scale_x)
            out_h = _round(F(y2 - y1 + 1) * scale_y)
            pad_x1, pad_x2 = _round(F(pad_x1) * scale_x), _round(F(pad_x2) * scale_x)
            pad_y1 = _round(F(pad_y1) * scale_y)
            pad_h = pad_y1
            pad_w = pad_x2 if do_mirror else pad_x1
            out_h = min(out_h, crop - pad_h)
            out_w = min(out_w, crop - pad_w)
        if not (0 <= x1 <= x2 < img.shape[1] and 0 <= y1 <= y2 < img.shape[0]):
            raise DataError(
                f"window {window[3:]} lies outside image {self.images[window[0]]!r}",
                path=self.source,
                got=img.shape[:2],
            )
        patch = cv.resize(img[y1 : y2 + 1, x1 : x2 + 1], out_h, out_w)
        if do_mirror:
            patch = patch[:, ::-1]
        return patch, pad_h, pad_w

    def next_batch(self) -> list[np.ndarray]:
        crop = self.crop
        data = np.zeros((self.batch_size, 3, crop, crop), F)
        labels = np.empty(self.batch_size, F)
        num_fg = int(F(self.batch_size) * self.fg_fraction)
        item = 0
        for windows, n in ((self.bg, self.batch_size - num_fg), (self.fg, num_fg)):
            for _ in range(n):
                window = windows[self.rng.draw() % len(windows)]
                do_mirror = self.mirror and self.rng.draw() % 2 == 1
                patch, pad_h, pad_w = self.warp(window, do_mirror)
                h, w = patch.shape[:2]
                chw = patch.transpose(2, 0, 1).astype(F)
                if self.mean is not None:
                    off = (self.mean.shape[-1] - crop) // 2
                    chw -= self.mean[
                        :, off + pad_h : off + pad_h + h, off + pad_w : off + pad_w + w
                    ]
                elif self.mean_values.size:
                    chw -= np.broadcast_to(self.mean_values, (3,)).reshape(3, 1, 1)
                data[item, :, pad_h : pad_h + h, pad_w : pad_w + w] = chw * self.scale
                labels[item] = window[1]
                item += 1
        return [data, labels]


@register_layer("WindowData")
class WindowDataLayer(SourceLayer):
    """R-CNN windows. Caffe type ``WindowData``, ``window_data_param`` (source: the window
    file, root_folder, batch_size, fg_threshold, bg_threshold, fg_fraction, context_pad,
    crop_mode warp | square, cache_images, scale) and ``transform_param`` (crop_size
    required, mirror, mean_file / mean_value).

    Each batch samples ``batch_size - int(batch_size * fg_fraction)`` background windows then
    the foreground ones, uniformly with replacement; each window (expanded by context_pad) is
    cut out, warped to crop_size x crop_size with INTER_LINEAR into a zero canvas, mirrored at
    random, mean-subtracted and scaled by ``window_data_param.scale``. Tops: data, label.
    """

    tops = Exactly(2)
    param_field = "window_data_param"
    prefetch_depth = 3
    restrictions = (
        "window sampling and mirror draw from an mt19937 seeded from torch's RNG, not "
        "Caffe's global RNG; the window file's images must be indexed 0, 1, 2, ... in order"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p, tp = self.param, layer_param.transform_param
        self._check_batch_size(p.batch_size)
        if tp.crop_size <= 0:
            raise self.error(
                "WindowData needs transform_param.crop_size", expected="> 0", got=tp.crop_size
            )
        if 2 * p.context_pad >= tp.crop_size:
            raise self.error(
                "context_pad too large for crop_size",
                expected=f"< {tp.crop_size / 2}",
                got=p.context_pad,
            )
        try:
            self.loader = WindowLoader(self, p, tp)
        except TorchCaffeError as err:
            raise err.located(layer=self.name, layer_type=self.caffe_type) from None
        b = int(p.batch_size)
        self._top_shapes = [(b, 3, int(tp.crop_size), int(tp.crop_size)), (b,)]
