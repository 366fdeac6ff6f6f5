"""Caffe's clamped logarithms in loss layers, with the gradients Caffe computes.

Caffe takes log(max(p, threshold)) so the loss stays finite, but its backward ignores the
clamp where it would zero the gradient: SoftmaxWithLoss and InfogainLoss backpropagate the
log-softmax gradient (prob - target), MultinomialLogisticLoss divides by max(p, threshold).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._transforms import with_jvp
from .function import CaffeFunction


class LogSoftmaxClamped(CaffeFunction):
    """(log(max(softmax(x), threshold)), softmax(x)) along ``axis``; backward as log_softmax.

    Caffe's gradient differs from the mathematical one where the clamp is active: it is the
    log-softmax gradient g - p * sum(g) whatever the probability. The probabilities (second
    output) get no gradient, as Caffe ignores the diff of a loss layer's prob top.

    A float16 ``x`` is computed in float32 and the outputs rounded back: in float16 a
    probability below 6e-8 and the thresholds (FLT_MIN, 1e-20) are 0, so the log of a
    confident miss would be -inf where Caffe's is log(threshold).
    """

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(x, axis: int, threshold: float):
        dtype = x.dtype
        if dtype == torch.float16:
            x = x.float()
        prob = torch.softmax(x, dim=axis)  # exp(x - max) / sum, as SoftmaxLayer
        log_prob = torch.log(torch.clamp(prob, min=threshold))
        if dtype == torch.float16 or torch.jit.is_tracing():
            # in a jit trace, ops of their own: without them the TorchScript ONNX exporter
            # wired the Function's outputs wrongly (LeNet's loss read -0.0008 for 7.49)
            return log_prob.to(dtype), prob.to(dtype)
        # elsewhere not ``.to(dtype)`` at the same dtype, which returns its input: dynamo
        # before torch 2.13 traced such an output so that the backward got no gradient
        # (torch 2.11 on an H200 machine: every compiled SoftmaxWithLoss net, LeNet's among
        # them, trained on zero gradients; backend "eager" too)
        return log_prob, prob

    @staticmethod
    def setup_context(ctx, inputs, output):
        prob = output[1]
        ctx.axis = inputs[1]
        ctx.save_for_backward(prob)
        ctx.save_for_forward(prob)
        ctx.mark_non_differentiable(prob)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, _grad_prob):
        (prob,) = ctx.saved_tensors
        return grad - prob * grad.sum(dim=ctx.axis, keepdim=True), None, None

    @staticmethod
    def tangent(ctx, x_t, *_):
        """The backward's transpose, t - sum(p * t); the probabilities take none."""
        (prob,) = ctx.saved_tensors
        return x_t - (prob * x_t).sum(dim=ctx.axis, keepdim=True), None


class LogClamped(CaffeFunction):
    """log(max(p, threshold)) with gradient 1 / max(p, threshold) (Caffe keeps it below the
    threshold, where the mathematical gradient is 0)."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(p, threshold: float):
        return torch.log(torch.clamp(p, min=threshold))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])
        ctx.threshold = inputs[1]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return grad / torch.clamp(p, min=ctx.threshold), None

    @staticmethod
    def tangent(ctx, p_t, _):
        (p,) = ctx.saved_tensors
        return p_t / torch.clamp(p, min=ctx.threshold)


def log_softmax_clamped(
    x: torch.Tensor, axis: int, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return with_jvp(LogSoftmaxClamped).apply(x, axis, threshold)


def log_clamped(p: torch.Tensor, threshold: float) -> torch.Tensor:
    return with_jvp(LogClamped).apply(p, threshold)
