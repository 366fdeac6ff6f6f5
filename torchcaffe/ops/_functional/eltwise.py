"""Caffe's Eltwise PROD with ``stable_prod_grad: false``.

Caffe's gradient differs from the mathematical one: bottom i's diff is
top_diff * (top / bottom_i), so it is NaN or inf where bottom_i is 0 (and rounds differently
from the product of the other bottoms).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._transforms import with_jvp
from .function import CaffeFunction


class CaffeUnstableProd(CaffeFunction):
    """b0 * b1 * ... (left to right) with EltwiseLayer's unstable PROD backward."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(*bottoms):
        top = bottoms[0] * bottoms[1]
        for b in bottoms[2:]:
            top = top * b
        return top

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output, *inputs)
        ctx.save_for_forward(output, *inputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        top, *bottoms = ctx.saved_tensors
        return tuple(
            (top / b) * grad if need else None for b, need in zip(bottoms, ctx.needs_input_grad)
        )

    @staticmethod
    def tangent(ctx, *tangents):  # the backward's transpose: each bottom's factor top / b
        top, *bottoms = ctx.saved_tensors
        terms = [(top / b) * t for b, t in zip(bottoms, tangents) if t is not None]
        return sum(terms[1:], terms[0])


def caffe_unstable_prod(*bottoms: torch.Tensor) -> torch.Tensor:
    """The product; through ``CaffeUnstableProd`` only where autograd records it. Without a
    gradient to shape, the Function is plain overhead, and dynamo (torch 2.13) traces its
    varargs forward under no_grad with the arguments lost (IndexError), a graph break, or
    an error with ``fullgraph=True``."""
    if torch.is_grad_enabled() and any(b.requires_grad for b in bottoms):
        return with_jvp(CaffeUnstableProd).apply(*bottoms)
    top = bottoms[0] * bottoms[1]
    for b in bottoms[2:]:
        top = top * b
    return top


FLT_MAX = 3.4028234663852886e38


class CaffeEltwiseInPlace(CaffeFunction):
    """Eltwise whose top is bottom 0's blob (the one in-place form Caffe's Net accepts), as
    EltwiseLayer's CPU code runs it: it writes the top while it reads bottom 0.

    Forward: SUM clears the top first, so bottom 0 adds 0 (sum of coeff_i * b_i, i >= 1);
    MAX sets it to -FLT_MAX, so bottom 0 competes as -FLT_MAX; PROD reads bottom 0 before
    writing. Backward reads the top as bottom 0's data, and bottom 0's diff is the top diff,
    so bottoms 1.. see bottom 0's diff as their top diff once it is written; PROD writes its
    factor there before it multiplies by the top diff, so bottom 0's diff is that factor
    squared. One output (torch.onnx's TorchScript exporter wires a Function's second output
    in place of its first): MAX's winners are found again where a gradient is wanted.
    """

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(op: str, coeff: list[float], stable: bool, *bottoms):
        if op == "SUM":
            top = torch.zeros_like(bottoms[0])
            for b, c in zip(bottoms[1:], coeff[1:]):
                top = top + c * b
            return top
        if op == "MAX":
            return _in_place_max(bottoms)[0]
        top = bottoms[0] * bottoms[1]
        for b in bottoms[2:]:
            top = top * b
        return top

    @staticmethod
    def setup_context(ctx, inputs, output):
        op, coeff, stable, _, *rest = inputs
        ctx.params = (op, coeff, stable)
        ctx.save_for_forward(*inputs[3:])
        if any(ctx.needs_input_grad):
            mask = _in_place_max(inputs[3:])[1] if op == "MAX" else None
            ctx.save_for_backward(output, mask, *rest)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        op, coeff, stable = ctx.params
        top, mask, *rest = ctx.saved_tensors
        data = [top, *rest]  # bottom 0's data is the top
        grads: list[torch.Tensor | None] = []
        for i in range(len(data)):
            if not ctx.needs_input_grad[3 + i]:
                grads.append(None)
                continue
            if op == "SUM":
                g = grad if coeff[i] == 1 else grad * coeff[i]
            elif op == "MAX":
                g = torch.where(mask == i, grad, torch.zeros_like(grad))
            else:
                if stable:
                    others = [d for j, d in enumerate(data) if j != i]
                    local = others[0]
                    for d in others[1:]:
                        local = local * d
                else:
                    local = top / data[i]
                # PROD builds its factor in bottom i's diff, then multiplies by the top diff:
                # for bottom 0 that is the same buffer, so the factor is squared
                g = local * (local if i == 0 else grad)
            grads.append(g)
            if i == 0:  # bottom 0's diff is the top diff the later bottoms read
                grad = g
        return (None, None, None, *grads)

    @staticmethod
    def tangent(ctx, _op, _coeff, _stable, *tangents):
        """The forward's own derivative (Caffe's in-place backward is no linear map to
        transpose: bottom 0's diff is PROD's factor squared): SUM's bottoms 1.. by their
        coefficients, MAX's winner (bottom 0 competes as the constant -FLT_MAX), PROD's
        product rule."""
        op, coeff, _ = ctx.params
        bottoms = ctx.saved_tensors
        ts = [torch.zeros_like(b) if t is None else t for b, t in zip(bottoms, tangents)]
        if op == "SUM":
            return sum((c * t for c, t in zip(coeff[1:], ts[1:])), torch.zeros_like(ts[0]))
        if op == "MAX":
            mask = _in_place_max(bottoms)[1]
            out = torch.zeros_like(ts[0])
            for i, t in enumerate(ts[1:], start=1):
                out = torch.where(mask == i, t, out)
            return out
        out = torch.zeros_like(ts[0])
        for i, t in enumerate(ts):
            term = t
            for j, b in enumerate(bottoms):
                if j != i:
                    term = term * b
            out = out + term
        return out


def caffe_eltwise_in_place(
    op: str, coeff: list[float], stable: bool, *bottoms: torch.Tensor
) -> torch.Tensor:
    return with_jvp(CaffeEltwiseInPlace).apply(op, coeff, stable, *bottoms)


def _in_place_max(bottoms) -> tuple[torch.Tensor, torch.Tensor]:
    """MAX with bottom 0 competing as -FLT_MAX -> (top, the winning bottom's index)."""
    first = torch.full_like(bottoms[0], -FLT_MAX)
    win = first > bottoms[1]
    top = torch.where(win, first, bottoms[1])
    mask = torch.where(win, 0, 1)
    for i, b in enumerate(bottoms[2:], start=2):
        win = b > top
        top = torch.where(win, b, top)
        mask = torch.where(win, i, mask)
    return top, mask
