"""Caffe's DataTransformer: crop, mirror, mean subtraction and scaling of one record.

The order and arithmetic are data_transformer.cpp's: ``do_mirror = mirror && Rand(2)``, then
(with crop_size) ``h_off = Rand(H - crop + 1)``, ``w_off = Rand(W - crop + 1)`` in TRAIN or the
centre ``((H - crop) / 2, (W - crop) / 2)`` otherwise; each output value is
``(x - mean) * scale`` in float32, with the mean file read at the crop offset and the mirror
flipping the output columns. Random draws come from a per-transformer mt19937 (``rng.py``).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import DataError, TorchCaffeError
from ..formats.binaryproto import read_mean_file
from ..proto import caffe_pb2 as pb
from .rng import CaffeRNG


class DataTransformer:
    """Applies a ``TransformationParameter`` to CxHxW arrays (uint8 pixels or float data).

    ``where`` names the layer/source in error messages.
    """

    def __init__(
        self,
        param: pb.TransformationParameter,
        phase: int = pb.TEST,
        *,
        where: str | None = None,
        seed: int | None = None,
    ) -> None:
        self.param = param
        self.phase = phase
        self.where = where
        self.scale = np.float32(param.scale)
        self.crop = int(param.crop_size)
        self.mirror = bool(param.mirror)
        self.force_color = bool(param.force_color)
        # both at once is refused only when an encoded datum comes (datum_to_array), as
        # Caffe's DataTransformer CHECKs it there: raw datums and ImageData ignore the flags
        self.force_gray = bool(param.force_gray)
        self.mean: np.ndarray | None = None
        self.mean_values = np.asarray(param.mean_value, np.float32)
        if param.HasField("mean_file"):
            if len(param.mean_value):
                raise DataError(
                    "cannot specify mean_file and mean_value at the same time", path=where
                )
            self.mean = self._read_mean(param.mean_file)
        needs_rand = self.mirror or (phase == pb.TRAIN and self.crop > 0)
        self.rng = CaffeRNG(seed) if needs_rand else None

    def _read_mean(self, path: str) -> np.ndarray:
        try:
            mean = read_mean_file(path)
        except TorchCaffeError as err:
            raise DataError(
                f"cannot read mean_file {path!r}: {err}",
                path=self.where,
                hint=f"mean_file is opened relative to the working directory {os.getcwd()}",
            ) from None
        if mean.ndim == 4 and mean.shape[0] >= 1:
            mean = mean[0]  # Caffe checks C, H, W only and reads the first image
        if mean.ndim != 3:
            raise DataError(
                f"mean_file {path!r} is not an NxCxHxW blob",
                path=self.where,
                expected="NxCxHxW",
                got=mean.shape,
            )
        return np.ascontiguousarray(mean, np.float32)

    # -- shapes ---------------------------------------------------------------------------
    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """InferBlobShape for a CxHxW record (without the batch axis)."""
        c, h, w = shape
        if c <= 0:
            raise DataError("record has no channels", path=self.where, got=shape)
        if h < self.crop or w < self.crop:
            raise DataError(
                "crop_size is larger than the record",
                path=self.where,
                expected=f"height and width >= {self.crop}",
                got=(h, w),
            )
        return (c, self.crop, self.crop) if self.crop else (c, h, w)

    # -- the transform --------------------------------------------------------------------
    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = np.empty(self.output_shape(x.shape), np.float32)
        self.transform_into(x, out)
        return out

    def transform_into(self, x: np.ndarray, out: np.ndarray) -> None:
        """Transform one CxHxW record into ``out`` (CxH'xW' float32), as Caffe's Transform."""
        c, h, w = x.shape
        shape = self.output_shape(x.shape)
        if out.shape != shape:
            raise DataError(
                "record shape differs from the batch's first record",
                path=self.where,
                expected=out.shape,
                got=shape,
            )
        do_mirror = self.mirror and self.rng is not None and self.rng.rand(2) == 1
        h_off = w_off = 0
        if self.crop:
            if self.phase == pb.TRAIN:
                assert self.rng is not None
                h_off = self.rng.rand(h - self.crop + 1)
                w_off = self.rng.rand(w - self.crop + 1)
            else:
                h_off, w_off = (h - self.crop) // 2, (w - self.crop) // 2
        oh, ow = shape[1], shape[2]
        window = (slice(None), slice(h_off, h_off + oh), slice(w_off, w_off + ow))
        src = x[window]
        if do_mirror:
            src = src[:, :, ::-1]
        np.copyto(out, src, casting="unsafe")
        if self.mean is not None:
            if self.mean.shape != (c, h, w):
                raise DataError(
                    "mean_file shape differs from the record's",
                    path=self.where,
                    expected=(c, h, w),
                    got=self.mean.shape,
                )
            mean = self.mean[window]
            out -= mean[:, :, ::-1] if do_mirror else mean
        elif self.mean_values.size:
            if self.mean_values.size not in (1, c):
                raise DataError(
                    "specify either 1 mean_value or as many as channels",
                    path=self.where,
                    expected=f"1 or {c}",
                    got=self.mean_values.size,
                )
            out -= self.mean_values.reshape(-1, 1, 1)
        if self.scale != 1:
            out *= self.scale

    def decode(self, datum: pb.Datum, *, source: str) -> np.ndarray:
        """A datum as the CxHxW array this transformer reads (force_color/gray on encoded)."""
        from .datum import datum_to_array

        return datum_to_array(
            datum, force_color=self.force_color, force_gray=self.force_gray, source=source
        )
