"""Caffe's Power layer, y = (shift + scale * x) ^ power, with Caffe's own backward.

Caffe's gradient differs from the mathematical one: it divides the output by the base
(power * y / x when shift is 0, power * scale * y / (shift + scale * x) otherwise), so it is
NaN or inf where the base is 0, and it is exactly 0 when power or scale is 0.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


def _base(x: torch.Tensor, scale: float, shift: float) -> torch.Tensor:
    """shift + scale * x, skipping the identity steps as Caffe does."""
    if scale != 1:
        x = x * scale
    if shift != 0:
        x = x + shift
    return x


class CaffePower(torch.autograd.Function):
    """(shift + scale * x) ^ power with Caffe's PowerLayer::Backward_cpu."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(x, power: float, scale: float, shift: float):
        if power * scale == 0:
            # The input is ignored: the top is 1 (power 0) or shift ^ power (scale 0).
            y = torch.full_like(x, 1.0 if power == 0 else shift)
            if power != 0:
                y = torch.pow(y, power)  # C pow: NaN for a negative shift and fractional power
        else:
            y = _base(x, scale, shift)
            if power != 1:
                y = torch.pow(y, power)
            elif y is x:
                y = x.clone()
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, power, scale, shift = inputs
        ctx.params = (power, scale, shift, power * scale)
        ctx.save_for_backward(x, output)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        power, scale, shift, diff_scale = ctx.params
        if diff_scale == 0:
            return torch.zeros_like(x), None, None, None
        if power == 1:
            dydx = torch.full_like(x, diff_scale)
        elif power == 2:
            dydx = x * (diff_scale * scale)
            if shift != 0:
                dydx = dydx + diff_scale * shift
        elif shift == 0:
            dydx = (y / x) * power
        else:
            dydx = y / _base(x, scale, shift)
            if diff_scale != 1:
                dydx = dydx * diff_scale
        return grad * dydx, None, None, None


def caffe_power(x: torch.Tensor, power: float, scale: float, shift: float) -> torch.Tensor:
    return CaffePower.apply(x, power, scale, shift)
