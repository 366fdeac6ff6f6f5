"""The pair distance of Caffe's ContrastiveLoss, with Caffe's epsilon in its gradient.

Caffe's gradient differs from the mathematical one: for a dissimilar pair it divides by
dist + 1e-4, not dist, so it stays finite (0) when the two embeddings coincide.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._transforms import with_jvp
from .function import CaffeFunction

# ContrastiveLossLayer::Backward_cpu adds this to the distance it divides by.
DIST_EPS = 1e-4


class CaffePairDistance(CaffeFunction):
    """sqrt(dist_sq) whose backward is grad / (2 (sqrt(dist_sq) + 1e-4))."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(dist_sq):
        return torch.sqrt(dist_sq)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (dist,) = ctx.saved_tensors
        return grad / (2 * (dist + DIST_EPS))

    @staticmethod
    def tangent(ctx, dist_sq_t):  # the backward's transpose: the same factor per element
        (dist,) = ctx.saved_tensors
        return dist_sq_t / (2 * (dist + DIST_EPS))


def caffe_pair_distance(dist_sq: torch.Tensor) -> torch.Tensor:
    return with_jvp(CaffePairDistance).apply(dist_sq)
