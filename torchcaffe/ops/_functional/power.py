"""Caffe's Power layer, y = (shift + scale * x) ^ power, with Caffe's own backward.

Caffe's gradient differs from the mathematical one: it divides the output by the base
(power * y / x when shift is 0, power * scale * y / (shift + scale * x) otherwise), so it is
NaN or inf where the base is 0, and it is exactly 0 when power or scale is 0.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._transforms import with_jvp
from .function import CaffeFunction


def _base(x: torch.Tensor, scale: float, shift: float) -> torch.Tensor:
    """shift + scale * x, skipping the identity steps as Caffe does."""
    if scale != 1:
        x = x * scale
    if shift != 0:
        x = x + shift
    return x


class CaffePower(CaffeFunction):
    """(shift + scale * x) ^ power with Caffe's PowerLayer::Backward_cpu, and the forward-mode
    derivative that is its transpose (``jvp``: the same slope per element)."""

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
        ctx.params = (power, scale, shift)
        ctx.save_for_backward(x, output)
        ctx.save_for_forward(x, output)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        power, scale, _ = ctx.params
        if power * scale == 0:
            return torch.zeros_like(x), None, None, None
        return grad * _slope(x, y, *ctx.params), None, None, None

    @staticmethod
    def tangent(ctx, x_t, *_):
        x, y = ctx.saved_tensors
        power, scale, _ = ctx.params
        if power * scale == 0:
            return torch.zeros_like(x)
        return x_t * _slope(x, y, *ctx.params)


def _slope(x: torch.Tensor, y: torch.Tensor, power: float, scale: float, shift: float):
    """Caffe's dy/dx per element (power * scale != 0)."""
    diff_scale = power * scale
    if power == 1:
        return torch.full_like(x, diff_scale)
    if power == 2:
        dydx = x * (diff_scale * scale)
        return dydx + diff_scale * shift if shift != 0 else dydx
    if shift == 0:
        return (y / x) * power
    dydx = y / _base(x, scale, shift)
    return dydx * diff_scale if diff_scale != 1 else dydx


def caffe_power(x: torch.Tensor, power: float, scale: float, shift: float) -> torch.Tensor:
    return with_jvp(CaffePower).apply(x, power, scale, shift)
