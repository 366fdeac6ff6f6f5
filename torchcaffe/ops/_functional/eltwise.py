"""Caffe's Eltwise PROD with ``stable_prod_grad: false``.

Caffe's gradient differs from the mathematical one: bottom i's diff is
top_diff * (top / bottom_i), so it is NaN or inf where bottom_i is 0 (and rounds differently
from the product of the other bottoms).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


class CaffeUnstableProd(torch.autograd.Function):
    """b0 * b1 * ... (left to right) with EltwiseLayer's unstable PROD backward."""

    @staticmethod
    def forward(ctx, *bottoms):
        top = bottoms[0] * bottoms[1]
        for b in bottoms[2:]:
            top = top * b
        ctx.save_for_backward(top, *bottoms)
        return top

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        top, *bottoms = ctx.saved_tensors
        return tuple(
            (top / b) * grad if need else None for b, need in zip(bottoms, ctx.needs_input_grad)
        )


def caffe_unstable_prod(*bottoms: torch.Tensor) -> torch.Tensor:
    return CaffeUnstableProd.apply(*bottoms)
