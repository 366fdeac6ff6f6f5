"""HDF5Output: writes its two bottoms to an HDF5 file (Caffe's HDF5OutputLayer)."""

from __future__ import annotations

import os

import numpy as np
import torch

from ..errors import DataError
from ..formats.atomic import atomic_write
from ..registry import register_layer
from .base import CaffeLayer, Exactly


def _as_4d(a: np.ndarray) -> np.ndarray:
    """Caffe reshapes the copies to (num, channels, height, width), missing axes as 1."""
    shape = tuple(a.shape) + (1,) * (4 - a.ndim)
    return a.reshape(shape[:4]) if a.ndim <= 4 else a.reshape(a.shape[0], -1, 1, 1)


@register_layer("HDF5Output")
class HDF5OutputLayer(CaffeLayer):
    """Caffe type ``HDF5Output``, ``hdf5_output_param { file_name }``; bottoms data and label,
    no tops. The file's datasets ``data`` and ``label`` hold the bottoms as float32
    (num, channels, height, width), the file name is relative to the working directory.

    Differs from Caffe: Caffe writes the first batch and aborts on the second forward (the
    datasets exist); here every forward appends its rows and the file is rewritten atomically,
    so it always holds every batch seen so far.
    """

    bottoms = Exactly(2)
    tops = Exactly(0)
    param_field = "hdf5_output_param"
    has_backward = False
    host_forward = "it writes its bottoms to an HDF5 file"
    restrictions = "appends every batch (Caffe writes one batch, then aborts on the next)"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self.file_name = self.param.file_name
        if not self.file_name:
            raise self.error("hdf5_output_param.file_name is required", expected="a file name")
        parent = os.path.dirname(os.path.abspath(self.file_name))
        if not os.path.isdir(parent):
            raise self.error(
                f"cannot write {self.file_name!r}: its directory does not exist", cls=DataError
            )
        if bottom_shapes and bottom_shapes[0][:1] != bottom_shapes[1][:1]:
            raise self.error(
                "data and label must have the same num",
                expected=bottom_shapes[0][:1],
                got=bottom_shapes[1][:1],
            )
        self._rows: list[list[np.ndarray]] = [[], []]

    def output_shapes(self, bottom_shapes):
        return []

    def forward(self, data: torch.Tensor, label: torch.Tensor):
        if data.shape[:1] != label.shape[:1]:
            raise self.error(
                "data and label must have the same num",
                expected=tuple(data.shape[:1]),
                got=tuple(label.shape[:1]),
            )
        for rows, t in zip(self._rows, (data, label)):
            rows.append(_as_4d(t.detach().to("cpu", torch.float32).numpy().copy()))
        self._write()
        return ()

    def _write(self) -> None:
        import h5py

        arrays = [np.concatenate(rows) for rows in self._rows]
        try:
            with atomic_write(self.file_name, "w+b") as f, h5py.File(f, "w") as h5:
                h5.create_dataset("data", data=arrays[0])
                h5.create_dataset("label", data=arrays[1])
        except OSError as err:
            raise self.error(f"cannot write {self.file_name!r} ({err})", cls=DataError) from None
