"""brocolli-caffe's ReLU6 with a slope: y = min(leaky_relu(x, negative_slope), threshold).

Caffe's gradient differs from the mathematical one: it is the leaky ReLU gradient (1 for
x > 0, negative_slope for x <= 0) masked by x < threshold, tested on the input, not on
whether the leaky output was clipped.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._transforms import with_jvp
from .function import CaffeFunction


class CaffeReLU6(CaffeFunction):
    """min(x > 0 ? x : negative_slope * x, threshold) with the fork's ReLU6 Backward_cpu."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(x, negative_slope: float, threshold: float):
        return torch.clamp(torch.where(x > 0, x, x * negative_slope), max=threshold)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, negative_slope, threshold = inputs
        ctx.params = (negative_slope, threshold)
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return _times_slope(grad, *ctx.saved_tensors, *ctx.params), None, None

    @staticmethod
    def tangent(ctx, x_t, *_):  # the backward's transpose: the same slope per element
        return _times_slope(x_t, *ctx.saved_tensors, *ctx.params)


def _times_slope(t: torch.Tensor, x: torch.Tensor, negative_slope: float, threshold: float):
    """``t`` times the fork's slope at ``x``: negative_slope below 0, 0 from threshold up."""
    t = torch.where(x > 0, t, t * negative_slope)
    return torch.where(x < threshold, t, torch.zeros_like(t))


def caffe_relu6(x: torch.Tensor, negative_slope: float, threshold: float) -> torch.Tensor:
    return with_jvp(CaffeReLU6).apply(x, negative_slope, threshold)
