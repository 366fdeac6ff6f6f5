"""Caffe's LSTMUnit step: gates i, f, o, g from 4H pre-activations, cont-masked forget gate.

Caffe's gradient differs from the mathematical one when cont is neither 0 nor 1: the forget
gate is f = cont * sigmoid(x_f) and Caffe's backward uses f * (1 - f) as its derivative
(the exact one is cont * s * (1 - s)). cont gets no gradient.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


class LSTMUnitStep(torch.autograd.Function):
    """c_prev (..., H), x (..., 4H), cont (...) -> (c, h)."""

    @staticmethod
    def forward(ctx, c_prev, x, cont):
        x_i, x_f, x_o, x_g = x.chunk(4, dim=-1)
        cont = cont.unsqueeze(-1)
        i, o, g = torch.sigmoid(x_i), torch.sigmoid(x_o), torch.tanh(x_g)
        f = (cont * torch.sigmoid(x_f)).masked_fill(cont == 0, 0.0)
        c = f * c_prev + i * g
        tanh_c = torch.tanh(c)
        ctx.save_for_backward(c_prev, i, f, o, g, tanh_c)
        return c, o * tanh_c

    @staticmethod
    @once_differentiable
    def backward(ctx, c_diff, h_diff):
        c_prev, i, f, o, g, tanh_c = ctx.saved_tensors
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


def lstm_unit_step(
    c_prev: torch.Tensor, x: torch.Tensor, cont: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return LSTMUnitStep.apply(c_prev, x, cont.detach())
