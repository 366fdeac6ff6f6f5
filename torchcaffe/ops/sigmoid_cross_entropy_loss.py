"""SigmoidCrossEntropyLoss: cross-entropy of sigmoid(x) against (soft) targets."""

from __future__ import annotations

import math

import torch

from ..registry import register_layer
from ._loss_normalization import (
    LossLayer,
    Norm,
    ignore_label,
    normalization_mode,
    normalizer,
    summed,
)


@register_layer("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(LossLayer):
    """-sum over counted targets of t log s + (1 - t) log(1 - s), s = sigmoid(x), divided by
    the normalizer. Caffe type ``SigmoidCrossEntropyLoss``, ``loss_param`` (ignore_label,
    normalization, legacy normalize).

    Evaluated as Caffe's stable form: x (t - [x >= 0]) - log(1 + exp(x - 2 x [x >= 0])),
    negated. Targets may be soft (any value in [0, 1]); an element whose target truncates
    to ``ignore_label`` is skipped. Normalizer: ``normalization`` when set, else
    ``normalize`` true -> VALID / false -> BATCH_SIZE, else BATCH_SIZE (not the proto's VALID
    default); outer = N, inner = count / N; at least 1.
    Differs from torch: binary_cross_entropy_with_logits with Caffe's normalizer and ignore
    label; the gradient is (sigmoid(x) - t) * loss_weight / normalizer, zero where ignored.
    """

    param_field = "loss_param"
    refused_bottoms = frozenset({1})  # LOG(FATAL): cannot backpropagate to label inputs

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self.ignore_label = ignore_label(self.param)
        self.normalization = normalization_mode(self, default=Norm.BATCH_SIZE)
        self._check_counts(*self.bottom_shapes)

    def _check_counts(self, x_shape, t_shape) -> None:
        if math.prod(x_shape) != math.prod(t_shape):
            raise self.error(
                "inputs must have the same count",
                expected=f"{math.prod(x_shape)} targets (as {tuple(x_shape)})",
                got=f"shape {tuple(t_shape)}",
            )

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self._check_counts(x.shape, target.shape)
        target = target.detach().reshape(x.shape)
        positive = (x >= 0).to(x.dtype)
        loss = -(x * (target - positive) - torch.log(1 + torch.exp(x - 2 * x * positive)))
        valid = None
        if self.ignore_label is not None:
            valid = target.long() != self.ignore_label
            loss = torch.where(valid, loss, 0.0)
        outer = x.shape[0]
        total = summed(loss)
        norm = normalizer(self.normalization, outer, x.numel() // max(outer, 1), valid, total)
        return (total / norm).to(x.dtype)
