"""Reduction: SUM, ASUM, SUMSQ or MEAN over all axes from ``axis`` on, times coeff."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..proto import caffe_pb2
from ..registry import register_layer
from ._narrow import computed_in_float32
from .base import CaffeLayer, Shape, canonical_axis

ReductionOp = caffe_pb2.ReductionParameter


@register_layer("Reduction")
class ReductionLayer(CaffeLayer):
    """Tail reduction. Caffe type ``Reduction``, ``reduction_param`` (operation = SUM,
    axis = 0, coeff = 1).

    Output shape: bottom.shape[:axis] (axis 0: a 0-d scalar). SUM: coeff * sum x; ASUM:
    coeff * sum |x| (gradient sign(x), 0 at 0); SUMSQ: coeff * sum x^2; MEAN: (coeff / n) *
    sum x with n = prod(shape[axis:]).
    Differs from torch: reduces every axis from ``axis`` on, not one axis.
    """

    param_field = "reduction_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        self.operation, self.coeff = p.operation, p.coeff
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        return [shape[: canonical_axis(self, self.param.axis, len(shape))]]

    # a float16 sum past 65504 (or square past 256) is inf where Caffe's float is finite,
    # even for a MEAN of small values
    @computed_in_float32
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        axis = canonical_axis(self, self.param.axis, x.dim())
        flat = x.reshape(*x.shape[:axis], math.prod(x.shape[axis:]))  # a batch of 0 too
        coeff = self.coeff
        if self.operation == ReductionOp.ASUM:
            flat = flat.abs()
        elif self.operation == ReductionOp.SUMSQ:
            flat = flat * flat
        elif self.operation == ReductionOp.MEAN:
            n = math.prod(x.shape[axis:])  # 0 items: Caffe's coeff / 0 is inf or NaN
            coeff = coeff / n if n else float(torch.tensor(coeff) / 0)
        top = flat.sum(-1)
        return top * coeff if coeff != 1 else top
