"""PSPNet's BN layer outside TRAIN: stored statistics forward, batch-statistics backward.

Caffe's gradient differs from the mathematical one: in TEST phase (not ``frozen``) BNLayer
normalizes with the stored mean and variance but its backward is the batch-normalization
formula (g - mean(g) - x_hat * mean(x_hat * g)) * inv_std, as if the statistics came from
the batch (the exact derivative would be g * inv_std).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._transforms import with_jvp
from .function import CaffeFunction


class StoredStatsBatchGrad(CaffeFunction):
    """x of shape (N, C, S), mean and inv_std of shape (C, 1): x_hat = (x - mean) * inv_std;
    means in the backward run over axes 0 and 2; mean and inv_std get no gradient."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(x, mean, inv_std):
        return (x - mean) * inv_std

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output, inputs[2])
        ctx.save_for_forward(output, inputs[2])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return _projected(grad, *ctx.saved_tensors), None, None

    @staticmethod
    def tangent(ctx, x_t, *_):  # the backward is symmetric: its transpose is itself
        return _projected(x_t, *ctx.saved_tensors)


def _projected(g: torch.Tensor, x_hat: torch.Tensor, inv_std: torch.Tensor) -> torch.Tensor:
    """(g - mean(g) - x_hat * mean(g * x_hat)) * inv_std, the means over axes 0 and 2."""
    mean_g = g.mean(dim=(0, 2), keepdim=True)
    mean_gx = (g * x_hat).mean(dim=(0, 2), keepdim=True)
    return (g - mean_g - x_hat * mean_gx) * inv_std


def stored_stats_batch_grad(
    x: torch.Tensor, mean: torch.Tensor, inv_std: torch.Tensor
) -> torch.Tensor:
    return with_jvp(StoredStatsBatchGrad).apply(x, mean, inv_std)
