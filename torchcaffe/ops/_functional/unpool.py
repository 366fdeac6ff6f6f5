"""Max-unpooling by a pooling mask: each bottom value written at its flat (h * W + w) index.

The forks' loop (SegNet ``Upsample``, brocolli ``MaxUnPool``) zeroes the top and writes bottom
element i at ``mask[i]`` in order, so where two elements share an index the later one wins.
SegNet's gradient differs from the mathematical one: every bottom element reads the top diff
at its index (``bottom_diff[i] = top_diff[mask[i]]``), the losers of a shared index included.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._loss_normalization import index_checks_wanted
from .._transforms import with_jvp
from .function import CaffeFunction


def check_mask_range(mask: torch.Tensor, size: int, error) -> torch.Tensor:
    """-> the mask as int64 flat indices (``static_cast<int>``: truncation toward 0); raise
    ``error(got)`` if one lies outside [0, size) (the forks abort or write out of bounds),
    where index checks run (``index_checks_wanted``: not on a device unless opted in)."""
    index = mask.detach().to(torch.int64)
    if index.numel() and index_checks_wanted(index):
        bad = (index < 0) | (index >= size)
        if bool(bad.any()):
            raise error(index[bad].unique().tolist()[:5])
    return index


def unpool_forward(x: torch.Tensor, index: torch.Tensor, out_hw: tuple[int, int]) -> torch.Tensor:
    """(N, C, H, W) values + int64 flat indices -> (N, C, *out_hw), zeros where nothing lands."""
    n, c = x.shape[:2]
    flat_x, flat_i = x.flatten(2), index.flatten(2)  # (no -1: a batch of 0 infers no size)
    size = out_hw[0] * out_hw[1]
    order = torch.arange(flat_x.shape[2], device=x.device).expand_as(flat_i)
    winner = torch.full((n, c, size), -1, dtype=torch.int64, device=x.device)
    # the last write wins; out of place, which torch.func batches (an in-place scatter into
    # an unbatched tensor it refuses)
    winner = winner.scatter_reduce(2, flat_i, order, reduce="amax")
    top = flat_x.gather(2, winner.clamp(min=0))
    top = torch.where(winner >= 0, top, torch.zeros((), dtype=x.dtype, device=x.device))
    return top.reshape(n, c, *out_hw)


class SegNetUnpool(CaffeFunction):
    """``unpool_forward`` with SegNet's Backward_cpu: bottom_diff[i] = top_diff[mask[i]]."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(x, index, out_hw):
        return unpool_forward(x, index, out_hw)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[1])
        ctx.save_for_forward(inputs[1])
        ctx.out_hw = inputs[2]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        n, c = index.shape[:2]
        grad_x = grad.reshape(n, c, -1).gather(2, index.reshape(n, c, -1))
        return grad_x.reshape(index.shape), None, None

    @staticmethod
    def tangent(ctx, x_t, *_):
        """The backward's transpose: each bottom tangent added at its index."""
        (index,) = ctx.saved_tensors
        n, c = index.shape[:2]
        size = ctx.out_hw[0] * ctx.out_hw[1]
        top = x_t.new_zeros((n, c, size))
        top = top.scatter_add(2, index.reshape(n, c, -1), x_t.reshape(n, c, -1))
        return top.reshape(n, c, *ctx.out_hw)


def segnet_unpool(x: torch.Tensor, index: torch.Tensor, out_hw: tuple[int, int]) -> torch.Tensor:
    return with_jvp(SegNetUnpool).apply(x, index, out_hw)
