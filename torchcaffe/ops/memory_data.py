"""MemoryData: batches served from arrays the user hands over (Caffe's MemoryDataLayer)."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import DataError, InputArrayError
from ..registry import register_layer
from .base import CaffeLayer, Exactly, Shape


@register_layer("MemoryData")
class MemoryDataLayer(CaffeLayer):
    """Caffe type ``MemoryData``, ``memory_data_param`` (batch_size, channels, height, width).

    ``reset(data, labels)`` (pycaffe: ``net.set_input_arrays``) gives N x C x H x W float
    data and N labels, N a multiple of batch_size; each forward serves the next batch_size
    rows and wraps. Tops: data (batch, C, H, W) and label (batch, 1, 1, 1) ((batch,) before the
    first forward, as Caffe sets it up). No transform is
    applied to arrays given this way, as in Caffe's Reset path.
    """

    bottoms = Exactly(0)
    tops = Exactly(2)
    param_field = "memory_data_param"
    has_backward = False

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        dims = (p.batch_size, p.channels, p.height, p.width)
        if any(d <= 0 for d in dims):
            raise self.error(
                "batch_size, channels, height and width must be positive",
                expected="> 0",
                got=dims,
            )
        self.batch_size = int(p.batch_size)
        self.dims = tuple(int(d) for d in dims[1:])
        self._data: torch.Tensor | None = None
        self._labels: torch.Tensor | None = None
        self._pos = 0
        self.register_buffer("_like", torch.zeros(0), persistent=False)

    def output_shapes(self, bottom_shapes) -> list[Shape]:
        """As DataLayerSetUp: the label is (batch,) until a forward reshapes it to 4-D."""
        return [(self.batch_size, *self.dims), (self.batch_size,)]

    def check_array(self, array: object, what: str, dims: tuple[int, ...]) -> None:
        """pycaffe's CheckContiguousArray: Reset keeps a pointer to the caller's memory, so
        the array must already be 4-D, C-contiguous float32 of the layer's (or label's) dims."""
        if not isinstance(array, np.ndarray):
            raise self.error(
                f"{what} must be a numpy array", got=type(array).__name__, cls=InputArrayError
            )
        for ok, problem, expected, got in (
            (array.flags.c_contiguous, "must be C contiguous", "C-contiguous", "strided"),
            (array.ndim == 4, "must be 4-d", 4, array.ndim),
            (array.dtype == np.float32, "must be float32", "float32", array.dtype),
            (array.shape[1:] == dims, "has the wrong shape", ("N", *dims), array.shape),
        ):
            if not ok:
                raise self.error(
                    f"{what} {problem}", expected=expected, got=got, cls=InputArrayError
                )

    def reset(self, data, labels) -> None:
        """Serve ``data`` (N, C, H, W) and ``labels`` (N,) or (N, 1, 1, 1) from row 0."""
        data = np.asarray(data, dtype=np.float32)
        labels = np.asarray(labels, dtype=np.float32)
        if data.ndim != 4 or data.shape[1:] != self.dims:
            raise self.error(
                "data array has the wrong shape",
                expected=("N", *self.dims),
                got=data.shape,
                cls=InputArrayError,
            )
        if labels.ndim == 1:
            labels = labels[:, None, None, None]
        if labels.ndim != 4 or labels.shape[1:] != (1, 1, 1):
            raise self.error(
                "label array has the wrong shape",
                expected="(N,) or (N, 1, 1, 1)",
                got=labels.shape,
                cls=InputArrayError,
            )
        if data.shape[0] != labels.shape[0]:
            raise self.error(
                "data and labels must have the same first dimension",
                expected=data.shape[0],
                got=labels.shape[0],
                cls=InputArrayError,
            )
        if data.shape[0] == 0 or data.shape[0] % self.batch_size:
            raise self.error(
                "first dimension of the input arrays must be a multiple of batch_size",
                expected=f"a positive multiple of {self.batch_size}",
                got=data.shape[0],
                cls=InputArrayError,
            )
        self._data = torch.from_numpy(np.ascontiguousarray(data))
        self._labels = torch.from_numpy(np.ascontiguousarray(labels))
        self._pos = 0

    def forward(self):
        if self._data is None or self._labels is None:
            raise self.error(
                "MemoryData needs its arrays before the first forward",
                hint="call net.set_input_arrays(data, labels) (or layer.reset(...))",
                cls=DataError,
            )
        rows = slice(self._pos, self._pos + self.batch_size)
        self._pos = (self._pos + self.batch_size) % self._data.shape[0]
        like: torch.Tensor = self._like  # type: ignore[assignment]
        return (
            self._data[rows].to(device=like.device, dtype=like.dtype),
            self._labels[rows].to(device=like.device, dtype=like.dtype),
        )
