"""Smooth L1 of element-weighted differences as the SSD fork's 3-bottom SmoothL1Loss.

That fork's gradient differs from the mathematical one: it is f'(w * d) without the factor
w, i.e. the weight bottom scales the value but not the gradient.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._transforms import with_jvp
from .function import CaffeFunction


def smooth_l1(d: torch.Tensor, sigma2: float) -> torch.Tensor:
    """0.5 sigma^2 d^2 where |d| < 1 / sigma^2, else |d| - 0.5 / sigma^2."""
    if sigma2 == 0:  # Caffe's 1 / sigma^2 is inf: every element is in the quadratic branch
        return d * d * 0.0
    quad = torch.abs(d) < 1.0 / sigma2
    return torch.where(quad, 0.5 * d * d * sigma2, torch.abs(d) - 0.5 / sigma2)


class WeightedSmoothL1Fork(CaffeFunction):
    """smooth_l1(w * d) with backward grad * smooth_l1'(w * d) to d; w gets no gradient."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(d, w, sigma2: float):
        return smooth_l1(w * d, sigma2)

    @staticmethod
    def setup_context(ctx, inputs, output):
        d, w, sigma2 = inputs
        ctx.save_for_backward(d, w)
        ctx.save_for_forward(d, w)
        ctx.sigma2 = sigma2

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        d, w = ctx.saved_tensors
        return grad * _slope(d, w, ctx.sigma2), None, None

    @staticmethod
    def tangent(ctx, d_t, *_):  # the backward's transpose: the same slope per element
        d, w = ctx.saved_tensors
        return d_t * _slope(d, w, ctx.sigma2)


def _slope(d: torch.Tensor, w: torch.Tensor, sigma2: float) -> torch.Tensor:
    """smooth_l1'(w * d), which the fork applies to d's gradient without w's factor."""
    wd = w * d
    if sigma2 == 0:
        return torch.zeros_like(wd)
    return torch.where(torch.abs(wd) < 1.0 / sigma2, sigma2 * wd, torch.sign(wd))


def weighted_smooth_l1_fork(d: torch.Tensor, w: torch.Tensor, sigma2: float) -> torch.Tensor:
    return with_jvp(WeightedSmoothL1Fork).apply(d, w, sigma2)
