"""SoftmaxWithLoss: multinomial logistic loss of the softmax of the scores."""

from __future__ import annotations

import math

import torch

from ..registry import register_layer
from ._functional.clamped_log import log_softmax_clamped
from ._loss_normalization import (
    FLT_MIN,
    LossLayer,
    check_label_count,
    check_labels,
    ignore_label,
    normalization_mode,
    normalizer,
    params_repr,
    summed,
)
from .base import Between, canonical_axis


@register_layer("SoftmaxWithLoss")
class SoftmaxWithLossLayer(LossLayer):
    """-sum over counted labels of log(max(softmax(x)[label], FLT_MIN)) / normalizer.
    Caffe type ``SoftmaxWithLoss``, ``softmax_param`` (axis) and ``loss_param``
    (ignore_label, normalization FULL/VALID/BATCH_SIZE/NONE, legacy normalize).

    Bottoms: scores (softmax over ``axis``), labels with count = outer * inner (the sizes
    before and after ``axis``). Tops: the scalar loss, optionally the probabilities.
    Normalizer: FULL outer*inner, VALID the non-ignored labels, BATCH_SIZE outer, NONE 1;
    at least 1. Unset ``normalization`` with ``normalize: true`` is VALID, false BATCH_SIZE.
    Differs from torch: the probability clamp at FLT_MIN; the gradient is (prob - onehot) *
    loss_weight / normalizer even where the clamp is active, zero at ignored labels; the
    probabilities top gets no gradient (Caffe ignores its diff).
    """

    param_field = "loss_param"
    refused_bottoms = frozenset({1})  # LOG(FATAL): cannot backpropagate to label inputs
    tops = Between(1, 2)

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        shape = self.bottom_shapes[0]
        self.axis = canonical_axis(
            self, layer_param.softmax_param.axis, len(shape), "softmax_param.axis"
        )
        self.ignore_label = ignore_label(self.param)
        self.normalization = normalization_mode(self)
        check_label_count(self, shape, self.bottom_shapes[1], self.axis)

    def extra_repr(self) -> str:
        return params_repr(self, "softmax_param", "loss_param")

    def forward(self, x: torch.Tensor, label: torch.Tensor):
        check_label_count(self, x.shape, label.shape, self.axis)
        outer, channels = math.prod(x.shape[: self.axis]), x.shape[self.axis]
        inner = math.prod(x.shape[self.axis + 1 :])
        log_prob, prob = log_softmax_clamped(x, self.axis, FLT_MIN)
        labels = label.detach().reshape(outer, 1, inner).long()
        valid = None if self.ignore_label is None else labels != self.ignore_label
        check_labels(self, labels, valid, channels)
        safe = labels if valid is None else torch.where(valid, labels, 0)
        picked = log_prob.reshape(outer, channels, inner).gather(1, safe)
        if valid is not None:
            picked = torch.where(valid, picked, 0.0)
        total = summed(picked)
        loss = (-total / normalizer(self.normalization, outer, inner, valid, total)).to(x.dtype)
        return (loss, prob) if self.num_tops == 2 else loss
