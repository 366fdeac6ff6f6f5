"""MultiBoxLoss's location gradient with ``encode_variance_in_target``.

The SSD fork divides the matched location predictions by the prior variances before its
SmoothL1/L2 loss, then copies the diff computed for the divided values straight into the
location bottom's diff, without the chain rule's division by the variance.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._transforms import with_jvp
from .function import CaffeFunction


class DivideForwardOnly(CaffeFunction):
    """``x / divisor`` in the forward; the incoming gradient passes to ``x`` unchanged."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(x: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
        return x / divisor

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def tangent(ctx, x_t, _):
        return x_t

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def divide_forward_only(x: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
    return with_jvp(DivideForwardOnly).apply(x, divisor)
