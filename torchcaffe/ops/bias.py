"""Bias: add a blob (learned, or bottom[1]) broadcast along some axes of bottom[0]."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from ._scale_bias import broadcastable, learned_shape, operand_axis
from .base import Between, CaffeLayer, Shape


@register_layer("Bias")
class BiasLayer(CaffeLayer):
    """y = x + b, b broadcast. Caffe type ``Bias``, ``bias_param`` (axis = 1, num_axes = 1,
    filler: constant 0).

    b is bottom[1] when given (its shape must equal bottom[0].shape[axis:axis + b.dim()]),
    else the learned blob ``bias`` of shape bottom[0].shape[axis:axis + num_axes] (num_axes
    -1: to the last axis). A scalar b ignores ``axis``. In-place use is allowed.
    Differs from torch: none (broadcast add; the gradient of b sums over the other axes).
    """

    param_field = "bias_param"
    bottoms = Between(1, 2)

    # param blobs, registered by add_blob
    bias: torch.Tensor

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        x_shape = self.bottom_shapes[0]
        if len(self.bottom_shapes) == 1:
            shape = learned_shape(self, x_shape, p.axis, p.num_axes, "bias", "bias_param")
            self.add_blob("bias", shape, filler=p.filler)
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        operand = bottom_shapes[1] if len(bottom_shapes) > 1 else tuple(self.bias.shape)
        operand_axis(self, bottom_shapes[0], operand, self.param.axis, "bias", "bias_param")
        return [tuple(int(d) for d in bottom_shapes[0])]

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # Shapes were checked once by output_shapes (the net's infer_shapes).
        b = self.bias if bias is None else bias
        axis = self.param.axis % x.dim() if b.dim() else 0
        return x + broadcastable(b, axis, x.dim())
