"""Softmax along one axis, as Caffe's SoftmaxLayer."""

from __future__ import annotations

import torch

from ..registry import register_layer
from .base import CaffeLayer, canonical_axis


@register_layer("Softmax")
class SoftmaxLayer(CaffeLayer):
    """exp(x - max) / sum(exp(x - max)) along ``axis``. Caffe type ``Softmax``,
    ``softmax_param`` (axis; engine is accepted and ignored).

    Differs from torch: none (torch.softmax also subtracts the max; the backward is
    (top_diff - sum(top_diff * y)) * y in both).
    """

    param_field = "softmax_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self.axis = canonical_axis(self, self.param.axis, len(self.bottom_shapes[0]))

    def output_shapes(self, bottom_shapes):
        # Arithmetic, not the meta forward: torch's meta softmax imports sympy (~0.3 s of a
        # process's first build).
        shape = tuple(int(d) for d in bottom_shapes[0])
        canonical_axis(self, self.param.axis, len(shape))
        return [shape]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=self.axis)
