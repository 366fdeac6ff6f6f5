"""Caffe's Clip with its own gradient: the top diff passes where min <= x <= max, the bounds
included.

torch.clamp's gradient at a bound is a convention that torch changed: up to 2.13 it passed the
gradient where x equals a bound, from 2.14 it passes none there (and half of it with tensor
bounds). Caffe's ClipLayer::Backward tests ``x >= min && x <= max``, so this Function computes
that mask itself, on every torch.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._transforms import with_jvp
from .function import CaffeFunction


class CaffeClip(CaffeFunction):
    """clamp(x, lo, hi) (lo <= hi) whose backward keeps the top diff where lo <= x <= hi."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(x, lo: float, hi: float):
        return torch.clamp(x, lo, hi)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, lo, hi = inputs
        ctx.bounds = (lo, hi)
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * inside(x, *ctx.bounds), None, None

    @staticmethod
    def tangent(ctx, x_t, *_):  # the backward's transpose: the same mask per element
        (x,) = ctx.saved_tensors
        return x_t * inside(x, *ctx.bounds)


def inside(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """1 where lo <= x <= hi, else 0 (NaN too), in ``x``'s dtype: Caffe's Clip slope."""
    return ((x >= lo) & (x <= hi)).to(x.dtype)


def caffe_clip(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return with_jvp(CaffeClip).apply(x, lo, hi)
