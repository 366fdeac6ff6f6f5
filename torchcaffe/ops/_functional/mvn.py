"""MVN's variance normalization with the gradient Caffe's MVNLayer computes.

Caffe's gradient differs from the mathematical one: it divides every term by sqrt(var) + eps,
where the derivative of the 1 / (sqrt(var) + eps) factor has sqrt(var) in one place. The two
agree when eps is 0.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._narrow import is_narrow
from .._transforms import with_jvp
from .function import CaffeFunction


class CaffeMVN(CaffeFunction):
    """Rows of a (groups, dim) tensor: y = (x - mean) / (sqrt(mean((x - mean)^2)) + eps).

    Backward (MVNLayer::Backward_cpu): (g - mean(g) - y * mean(g * y)) / (sqrt(var) + eps).
    One output: torch.onnx's TorchScript exporter wires a Function's second output in place
    of its first. What the backward needs besides is computed again, by the same ops, where a
    gradient is wanted (``setup_context`` runs after every forward). Forward mode (``tangent``,
    which ``with_jvp`` gives as jvp) is the backward's transpose: the backward is symmetric in g.
    """

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(x, eps: float):
        centered, denom = _centered_and_denominator(x, eps)
        return centered / denom

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.eps = inputs[1]
        ctx.save_for_forward(inputs[0], output)  # references; jvp computes its denominator
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(output, _centered_and_denominator(*inputs)[1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        y, denom = ctx.saved_tensors
        return _projected(grad, y, denom), None

    @staticmethod
    def tangent(ctx, x_t, _):
        x, y = ctx.saved_tensors
        return _projected(x_t, y, _centered_and_denominator(x, ctx.eps)[1])


def _projected(g: torch.Tensor, y: torch.Tensor, denom: torch.Tensor) -> torch.Tensor:
    """(g - mean(g) - y * mean(g * y)) / denom over each row."""
    sums = y * (y * g).sum(dim=1, keepdim=True) + g.sum(dim=1, keepdim=True)
    return (g - sums / y.shape[1]) / denom


class CaffeMVNInPlace(CaffeMVN):
    """CaffeMVN with top == bottom: Caffe's Backward writes the bottom diff over the top diff
    it is still reading, so the sum of g and the final g - sums / dim see its partial results.
    That last step, caffe_cpu_axpby(1, top_diff, -1 / dim, bottom_diff) with X == Y, is
    BVLC's non-MKL cblas_saxpby: Y *= -1 / dim, then Y += X, which is Y again, so -2 d / dim.

    Backward: d = y * sum(g * y); d = d + sum(d); (-2 d / dim) / (sqrt(var) + eps).
    """

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        y, denom = ctx.saved_tensors
        dim = y.shape[1]
        d = y * (y * grad).sum(dim=1, keepdim=True)
        d = d + d.sum(dim=1, keepdim=True)
        return aliased_axpby(d, dim) / denom, None

    @staticmethod
    def tangent(ctx, x_t, _):
        """The backward's transpose: it is -2 / (dim * denom) (I + 11^T) y y^T g, so this is
        -2 / (dim * denom) y (y . t + sum(t) sum(y))."""
        x, y = ctx.saved_tensors
        denom = _centered_and_denominator(x, ctx.eps)[1]
        inner = (y * x_t).sum(dim=1, keepdim=True)
        inner = inner + x_t.sum(dim=1, keepdim=True) * y.sum(dim=1, keepdim=True)
        return y * inner * (-2.0 / y.shape[1]) / denom


def _centered_and_denominator(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x - mean and sqrt(mean((x - mean)^2)) + eps over each row."""
    centered = x - x.mean(dim=1, keepdim=True)
    return centered, torch.sqrt((centered * centered).mean(dim=1, keepdim=True)) + eps


def aliased_axpby(d: torch.Tensor, dim: int) -> torch.Tensor:
    """caffe_cpu_axpby(1, d, -1 / dim, d) on one buffer: scal (d * (-1 / dim)), then axpy
    adds the scaled buffer to itself."""
    scaled = d * (-1.0 / dim)
    return scaled + scaled


def caffe_mvn(x: torch.Tensor, eps: float, in_place: bool = False) -> torch.Tensor:
    """A float16/bfloat16 ``x`` is normalized in float32 and rounded back: eps 1e-9 is 0 in
    float16, so a constant row would be 0 / 0 where Caffe's float gives 0, and a float16
    square of a deviation past 256 is inf."""
    if is_narrow(x.dtype):
        return caffe_mvn(x.float(), eps, in_place).to(x.dtype)
    return with_jvp(CaffeMVNInPlace if in_place else CaffeMVN).apply(x, eps)
