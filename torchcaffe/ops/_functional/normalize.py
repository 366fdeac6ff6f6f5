"""SSD's Normalize (L2 norm, learned scale) with the gradients NormalizeLayer computes.

Caffe's gradient differs from the mathematical one with a per-channel scale: the bottom diff
is scale[c] * (g - x * sum(x * g) / norm^2) / norm, so the scale of channel c multiplies the
whole term instead of weighting the sum over channels; and the scale diff is
sum(top * g) / scale (NaN or inf where a scale is 0).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._narrow import is_narrow
from .._transforms import with_jvp
from .function import CaffeFunction


class CaffeNormalize(CaffeFunction):
    """x of shape (N, C, S): y = x / norm * scale, norm = sqrt(sum x^2 + eps) over ``dims``
    ((1, 2) across_spatial, else (1,)); scale is a 0-D or (C,) tensor.
    One output: torch.onnx's TorchScript exporter wires a Function's second output in place
    of its first. What the backward needs besides is computed again, by the same ops, where a
    gradient is wanted (``setup_context`` runs after every forward). Forward mode (``tangent``,
    which ``with_jvp`` gives as jvp) is the backward's transpose."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(x, scale, dims: tuple[int, ...], eps: float):
        s = scale.reshape(-1, 1) if scale.dim() else scale
        return x / _norm(x, dims, eps) * s

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, scale, dims, eps = inputs
        ctx.dims, ctx.eps = dims, eps
        ctx.save_for_forward(x, scale)  # references; jvp computes its norm
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(x, _norm(x, dims, eps), scale, output)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, norm, scale, top = ctx.saved_tensors
        grad_x = grad_scale = None
        if ctx.needs_input_grad[1]:
            if scale.dim():
                grad_scale = (top * grad).sum(dim=(0, 2)) / scale
            else:
                grad_scale = (top * grad).sum() / scale
        if ctx.needs_input_grad[0]:
            a = (x * grad).sum(dim=ctx.dims, keepdim=True)
            grad_x = (grad - x * (a / norm / norm)) / norm
            grad_x = grad_x * (scale.reshape(-1, 1) if scale.dim() else scale)
        return grad_x, grad_scale, None, None

    @staticmethod
    def tangent(ctx, x_t, scale_t, *_):
        """(s t - x (x . s t) / norm^2) / norm for x's tangent t (the backward multiplies by
        the per-channel scale s after projecting, so its transpose before), plus x / norm
        times the scale's tangent (the backward's top / scale)."""
        x, scale = ctx.saved_tensors
        norm = _norm(x, ctx.dims, ctx.eps)
        out = torch.zeros_like(x)
        if x_t is not None:
            u = x_t * (scale.reshape(-1, 1) if scale.dim() else scale)
            a = (x * u).sum(dim=ctx.dims, keepdim=True)
            out = out + (u - x * (a / norm / norm)) / norm
        if scale_t is not None:
            out = out + x / norm * (scale_t.reshape(-1, 1) if scale_t.dim() else scale_t)
        return out


def _norm(x: torch.Tensor, dims: tuple[int, ...], eps: float) -> torch.Tensor:
    return torch.sqrt((x * x).sum(dim=dims, keepdim=True) + eps)


def caffe_normalize(
    x: torch.Tensor, scale: torch.Tensor, across_spatial: bool, eps: float
) -> torch.Tensor:
    """A float16/bfloat16 ``x`` is normalized in float32 and rounded back: in float16 a sum of
    squares past 65504 is inf (SSD's conv4_3 features reach hundreds) and eps 1e-10 is 0, so
    a zero row would be 0 / 0 where Caffe's float gives 0."""
    dims = (1, 2) if across_spatial else (1,)
    if is_narrow(x.dtype):
        return with_jvp(CaffeNormalize).apply(x.float(), scale.float(), dims, eps).to(x.dtype)
    return with_jvp(CaffeNormalize).apply(x, scale, dims, eps)
