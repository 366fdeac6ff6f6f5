"""Caffe's LSTMUnit step: gates i, f, o, g from 4H pre-activations, cont-masked forget gate.

Caffe's gradient differs from the mathematical one when cont is neither 0 nor 1: the forget
gate is f = cont * sigmoid(x_f) and Caffe's backward uses f * (1 - f) as its derivative
(the exact one is cont * s * (1 - s)). cont gets no gradient.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._transforms import with_jvp
from .function import CaffeFunction


class LSTMUnitStep(CaffeFunction):
    """c_prev (..., H), x (..., 4H), cont (...) -> (c, h, and the gates i, f, o, g and
    tanh(c) that the backward reads, which take no gradient)."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(c_prev, x, cont):
        i, f, o, g, c, tanh_c = _gates(c_prev, x, cont)
        return c, o * tanh_c, i, f, o, g, tanh_c

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], *output[2:])
        ctx.save_for_forward(inputs[0], *output[2:])
        ctx.mark_non_differentiable(*output[2:])
        ctx.set_materialize_grads(False)

    @staticmethod
    @once_differentiable
    def backward(ctx, c_diff, h_diff, *_):
        c_prev, i, f, o, g, tanh_c = ctx.saved_tensors
        if c_diff is None:
            c_diff = torch.zeros_like(c_prev)
        if h_diff is None:
            h_diff = torch.zeros_like(c_prev)
        c_term = c_diff + h_diff * o * (1 - tanh_c * tanh_c)
        x_diff = torch.cat(
            (
                c_term * g * i * (1 - i),
                c_term * c_prev * f * (1 - f),
                h_diff * tanh_c * o * (1 - o),
                c_term * i * (1 - g * g),
            ),
            dim=-1,
        )
        return c_term * f, x_diff, None

    @staticmethod
    def tangent(ctx, c_prev_t, x_t, _):
        """The forward's derivative, the backward's transpose (f's slope f (1 - f), as the
        backward has it): the tangents of c and h; the gates take none."""
        c_prev, i, f, o, g, tanh_c = ctx.saved_tensors
        c_t = torch.zeros_like(c_prev) if c_prev_t is None else f * c_prev_t
        h_t = torch.zeros_like(c_prev)
        if x_t is not None:
            t_i, t_f, t_o, t_g = x_t.chunk(4, dim=-1)
            c_t = c_t + c_prev * f * (1 - f) * t_f + g * i * (1 - i) * t_i + i * (1 - g * g) * t_g
            h_t = tanh_c * o * (1 - o) * t_o
        h_t = h_t + o * (1 - tanh_c * tanh_c) * c_t
        return c_t, h_t, None, None, None, None, None


def lstm_unit_step(
    c_prev: torch.Tensor, x: torch.Tensor, cont: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (c, h). Traced by torch.jit, the gates' own ops: the TorchScript ONNX exporter wires
    a Function's outputs wrongly when it has more than it returns (silently wrong numbers).
    Their autograd gradient is this one's where ``cont`` is 0 or 1, as sequence markers are."""
    if torch.jit.is_tracing():
        _, _, o, _, c, tanh_c = _gates(c_prev, x, cont.detach())
        return c, o * tanh_c
    c, h = with_jvp(LSTMUnitStep).apply(c_prev, x, cont.detach())[:2]
    return c, h


def _gates(c_prev: torch.Tensor, x: torch.Tensor, cont: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """-> (i, f, o, g, c, tanh(c)): LSTMUnitLayer's gate activations and new cell."""
    x_i, x_f, x_o, x_g = x.chunk(4, dim=-1)
    cont = cont.unsqueeze(-1)
    i, o, g = torch.sigmoid(x_i), torch.sigmoid(x_o), torch.tanh(x_g)
    f = (cont * torch.sigmoid(x_f)).masked_fill(cont == 0, 0.0)
    c = f * c_prev + i * g
    return i, f, o, g, c, torch.tanh(c)
