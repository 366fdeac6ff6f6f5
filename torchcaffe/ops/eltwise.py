"""Eltwise: element-wise PROD, SUM (with per-bottom coefficients) or MAX of the bottoms."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..proto import caffe_pb2
from ..registry import register_layer
from ._functional.eltwise import caffe_eltwise_in_place, caffe_unstable_prod
from .base import AtLeast, CaffeLayer, Exactly, Shape

EltwiseOp = caffe_pb2.EltwiseParameter


@register_layer("Eltwise")
class EltwiseLayer(CaffeLayer):
    """Element-wise combination of equally shaped bottoms. Caffe type ``Eltwise``,
    ``eltwise_param`` (operation, coeff, stable_prod_grad).

    SUM: sum_i coeff_i * b_i (coeff: none, or one per bottom). PROD: b0 * b1 * ...; its
    backward is the product of the other bottoms (stable_prod_grad, default) or
    top_diff * top / b_i (a custom Function, NaN/inf where b_i == 0). MAX: Caffe's mask: bottom
    1 wins over bottom 0 unless b0 > b1 strictly, a later bottom wins only when strictly
    greater; the whole gradient goes to the winner.
    Differs from torch: MAX tie-breaking and the unstable PROD gradient.
    """

    param_field = "eltwise_param"
    bottoms = AtLeast(2)
    tops = Exactly(1)

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        n = len(layer_param.bottom)
        if len(p.coeff) not in (0, n):
            raise self.error(
                "Eltwise takes one coefficient per bottom blob",
                expected=f"0 or {n} coeff values",
                got=len(p.coeff),
            )
        if p.operation == EltwiseOp.PROD and len(p.coeff):
            raise self.error(
                "Eltwise only takes coefficients (coeff) for SUM",
                expected="no coeff with operation PROD",
                got=list(p.coeff),
            )
        self.operation = p.operation
        self.coeff = list(p.coeff) or [1.0] * n
        self.stable_prod_grad = p.stable_prod_grad
        self.output_shapes(self.bottom_shapes)
        # In place (Caffe allows only top == bottom 0), Caffe's loops read the top they write.
        self.in_place = layer_param.top[0] == layer_param.bottom[0]

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        first = tuple(int(d) for d in bottom_shapes[0])
        for i, shape in enumerate(bottom_shapes[1:], start=1):
            if tuple(int(d) for d in shape) != first:
                raise self.error(
                    f"bottom {i} differs in shape from bottom 0", expected=first, got=tuple(shape)
                )
        return [first]

    def forward(self, *bottoms: torch.Tensor) -> torch.Tensor:
        if self.in_place:
            op = EltwiseOp.EltwiseOp.Name(self.operation)
            return caffe_eltwise_in_place(op, self.coeff, self.stable_prod_grad, *bottoms)
        if self.operation == EltwiseOp.PROD:
            if not self.stable_prod_grad:
                return caffe_unstable_prod(*bottoms)
            top = bottoms[0] * bottoms[1]
            for b in bottoms[2:]:
                top = top * b
            return top
        if self.operation == EltwiseOp.SUM:
            c0 = self.coeff[0]
            top = bottoms[0] * c0 if c0 != 1 else bottoms[0]
            for b, c in zip(bottoms[1:], self.coeff[1:]):
                top = torch.add(top, b, alpha=c)
            return top
        # MAX: torch.where routes the gradient exactly along Caffe's argmax mask.
        a, b = bottoms[0], bottoms[1]
        top = torch.where(a > b, a, b)
        for b in bottoms[2:]:
            top = torch.where(b > top, b, top)
        return top
