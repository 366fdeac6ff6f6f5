"""Scale: multiply by a blob (learned, or bottom[1]) broadcast along some axes of bottom[0]."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..proto import caffe_pb2
from ..registry import register_layer
from ._scale_bias import broadcastable, learned_shape, operand_axis
from .base import Between, CaffeLayer, Shape


@register_layer("Scale")
class ScaleLayer(CaffeLayer):
    """y = x * s (+ b), s and b broadcast. Caffe type ``Scale``, ``scale_param`` (axis = 1,
    num_axes = 1, filler: constant 1, bias_term = false, bias_filler: constant 0).

    s is bottom[1] when given (its shape must equal bottom[0].shape[axis:axis + s.dim()]),
    else the learned blob ``weight`` of shape bottom[0].shape[axis:axis + num_axes] (num_axes
    -1: to the last axis). ``bias_term`` adds the learned blob ``bias`` over the same axes as s
    (Caffe's inner Bias layer). Blob order: [weight, bias]; with bottom[1] only [bias]. A
    scalar s ignores ``axis``. In-place use is allowed.
    Differs from torch: none (broadcast multiply-add).
    """

    param_field = "scale_param"
    bottoms = Between(1, 2)
    restrictions = (
        "the learned scale's diff is always accumulated; Caffe overwrites it "
        "when bottom[0] has one outer index (count(0, axis) == 1) and the scale "
        "more than one element, which shows only with iter_size > 1 or shared "
        "scale params"
    )

    # param blobs, registered by add_blob
    weight: torch.Tensor
    bias: torch.Tensor

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        x_shape = self.bottom_shapes[0]
        self.has_scale_blob = len(self.bottom_shapes) == 1
        if self.has_scale_blob:
            shape = learned_shape(self, x_shape, p.axis, p.num_axes, "scale", "scale_param")
            filler = (
                p.filler
                if p.HasField("filler")
                else caffe_pb2.FillerParameter(type="constant", value=1.0)
            )
            self.add_blob("weight", shape, filler=filler)
        if p.bias_term:
            num_axes = p.num_axes if self.has_scale_blob else len(self.bottom_shapes[1])
            shape = learned_shape(self, x_shape, p.axis, num_axes, "bias", "scale_param")
            self.add_blob("bias", shape, filler=p.bias_filler)
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        x_shape = bottom_shapes[0]
        operand = tuple(self.weight.shape) if self.has_scale_blob else bottom_shapes[1]
        operand_axis(self, x_shape, operand, self.param.axis, "scale", "scale_param")
        if self.param.bias_term:
            operand_axis(self, x_shape, self.bias.shape, self.param.axis, "bias", "scale_param")
        return [tuple(int(d) for d in x_shape)]

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        # Shapes were checked once by output_shapes (the net's infer_shapes).
        s = self.weight if scale is None else scale
        axis = self.param.axis % x.dim() if s.dim() else 0
        s = broadcastable(s, axis, x.dim())
        if not self.param.bias_term:
            return x * s
        b = self.bias
        b = broadcastable(b, self.param.axis % x.dim() if b.dim() else 0, x.dim())
        return torch.addcmul(b, x, s)  # Scale + its Bias in one fused op
