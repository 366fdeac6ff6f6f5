"""Unsqueeze (brocolli-caffe): insert an axis of size 1."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from .base import CaffeLayer, Shape


@register_layer("Unsqueeze", fork="brocolli")
class UnsqueezeLayer(CaffeLayer):
    """Insert a size-1 axis. Caffe type ``Unsqueeze`` (brocolli-caffe), ``unsqueeze_param``
    (dim: required; negative counts from the end, -1 appends a trailing axis).

    Forward only: the fork's backward is empty, so no gradient flows through (as there).
    Differs from torch: none (Tensor.unsqueeze).
    """

    param_field = "unsqueeze_param"
    has_backward = False

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        if not self.param.HasField("dim"):
            raise self.error("dim must be set", expected="unsqueeze_param { dim: D }", got="no dim")
        self.output_shapes(self.bottom_shapes)

    def _axis(self, num_axes: int) -> int:
        axis = self.param.dim + num_axes + 1 if self.param.dim < 0 else self.param.dim
        if not 0 <= axis <= num_axes:
            raise self.error(
                "dim is out of range for the bottom",
                expected=f"{-num_axes - 1} <= dim <= {num_axes}",
                got=self.param.dim,
            )
        return axis

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = [int(d) for d in bottom_shapes[0]]
        shape.insert(self._axis(len(shape)), 1)
        return [tuple(shape)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().unsqueeze(self._axis(x.dim()))
