"""Flatten: merge the axes axis..end_axis into one."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..registry import register_layer
from .base import CaffeLayer, Shape, canonical_axis


@register_layer("Flatten")
class FlattenLayer(CaffeLayer):
    """Flattening. Caffe type ``Flatten``, ``flatten_param`` (axis = 1, end_axis = -1).

    Output: shape[:axis] + (prod(shape[axis:end_axis+1]),) + shape[end_axis+1:]. As in Caffe,
    end_axis == axis - 1 is allowed and inserts a singleton axis. No in-place use.
    Differs from torch: torch.flatten rejects end_axis < axis.
    """

    param_field = "flatten_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        if list(layer_param.top[:1]) == list(layer_param.bottom[:1]):
            raise self.error(
                "Flatten does not allow in-place computation",
                expected="a top blob other than the bottom",
                got=f"top {layer_param.top[0]!r} == bottom",
            )
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        p = self.param
        start = canonical_axis(self, p.axis, len(shape))
        end = canonical_axis(self, p.end_axis, len(shape), "end_axis")
        if end + 1 < start:
            raise self.error(
                "end_axis must not be before axis - 1",
                expected=f"end_axis >= {start - 1} (axis {start})",
                got=end,
            )
        return [shape[:start] + (math.prod(shape[start : end + 1]),) + shape[end + 1 :]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # from the axes, not from output_shapes: its int() of each size would pin a symbolic
        # batch to its example value under torch.export and dynamic compiles
        p = self.param
        start = canonical_axis(self, p.axis, x.dim())
        end = canonical_axis(self, p.end_axis, x.dim(), "end_axis")
        return x.unsqueeze(start) if end + 1 == start else x.flatten(start, end)
