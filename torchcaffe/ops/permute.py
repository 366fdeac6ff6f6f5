"""Permute (SSD fork): reorder a blob's axes."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from .base import CaffeLayer, Shape


@register_layer("Permute", fork="SSD")
class PermuteLayer(CaffeLayer):
    """Axis permutation. Caffe type ``Permute`` (SSD fork), ``permute_param`` (repeated order).

    The named orders come first; the axes not named follow in their original order, so
    ``order: 0 order: 3`` on N x C x H x W means (0, 3, 1, 2). An order at or past the number
    of axes, or named twice, is an error (the fork aborts). Backward scatters the top diff
    back (torch's permute). Differs from torch: none (Tensor.permute, made contiguous).
    """

    param_field = "permute_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        num_axes = len(self.bottom_shapes[0])
        named = [int(o) for o in self.param.order]
        for order in named:
            if order >= num_axes:
                raise self.error(
                    "order must be less than the bottom's number of axes",
                    expected=f"order < {num_axes}",
                    got=order,
                )
        if len(set(named)) != len(named):
            raise self.error(
                "there are duplicate orders", expected="each axis named once", got=named
            )
        self.order = tuple(named + [i for i in range(num_axes) if i not in named])

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = bottom_shapes[0]
        if len(shape) != len(self.order):
            raise self.error(
                "the bottom's number of axes changed since setup",
                expected=f"{len(self.order)} axes",
                got=list(shape),
            )
        return [tuple(int(shape[i]) for i in self.order)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(*self.order).contiguous()
