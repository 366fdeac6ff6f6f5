"""Concat: join bottoms along one axis."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from .base import AtLeast, CaffeLayer, Exactly, Shape, canonical_axis


@register_layer("Concat")
class ConcatLayer(CaffeLayer):
    """Concatenation. Caffe type ``Concat``, ``concat_param`` (axis, or legacy concat_dim).

    Every bottom has bottom 0's shape except along the axis; the top's axis is their sum. One
    bottom: the top is the bottom (Caffe shares data and diff). ``concat_dim`` is unsigned and
    has no negative indexing; giving both it and ``axis`` is an error.
    Differs from torch: none (torch.cat).
    """

    param_field = "concat_param"
    bottoms = AtLeast(1)
    tops = Exactly(1)

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if p.HasField("axis") and p.HasField("concat_dim"):
            raise self.error(
                "either axis or concat_dim should be specified, not both",
                expected="one of axis / concat_dim",
                got=f"axis {p.axis} and concat_dim {p.concat_dim}",
            )
        self.output_shapes(self.bottom_shapes)

    def concat_axis(self, num_axes: int) -> int:
        p = self.param
        if p.HasField("concat_dim"):
            if p.concat_dim >= num_axes:
                raise self.error(
                    "concat_dim out of range",
                    expected=f"0 <= concat_dim < {num_axes}",
                    got=p.concat_dim,
                )
            return p.concat_dim
        return canonical_axis(self, p.axis, num_axes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        first = tuple(int(d) for d in bottom_shapes[0])
        axis = self.concat_axis(len(first))
        top = list(first)
        for i, shape in enumerate(bottom_shapes[1:], start=1):
            shape = tuple(int(d) for d in shape)
            if len(shape) != len(first):
                raise self.error(
                    "all inputs must have the same number of axes",
                    expected=f"{len(first)} axes in bottom {i}",
                    got=len(shape),
                )
            if any(a != b for j, (a, b) in enumerate(zip(first, shape)) if j != axis):
                raise self.error(
                    f"all inputs must have the same shape except at the concat axis ({axis})",
                    expected=f"bottom {i} like {first}",
                    got=shape,
                )
            top[axis] += shape[axis]
        return [tuple(top)]

    def forward(self, *bottoms: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():  # int() of symbolic sizes would fix the batch
            self.output_shapes([tuple(b.shape) for b in bottoms])
        if len(bottoms) == 1:
            return bottoms[0].view_as(bottoms[0])
        return torch.cat(bottoms, dim=self.concat_axis(bottoms[0].dim()))
