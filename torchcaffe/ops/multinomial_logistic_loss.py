"""MultinomialLogisticLoss: negative log-likelihood of given class probabilities."""

from __future__ import annotations

import math

import torch

from ..registry import register_layer
from ._functional.clamped_log import log_clamped
from ._loss_normalization import LOG_THRESHOLD, LossLayer, check_labels, legacy_dim
from ._narrow import computed_in_float32


@register_layer("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(LossLayer):
    """-sum_n log(max(p[n, label_n], 1e-20)) / N. Caffe type ``MultinomialLogisticLoss``;
    no params.

    Bottom 0 holds probabilities, flattened to (N, count / N); bottom 1 one label per item
    (shape (N,) or (N, 1, 1, 1)).
    Differs from torch: the clamp at kLOG_THRESHOLD = 1e-20; Caffe's gradient is
    -loss_weight / (N max(p, 1e-20)) at the label, also where the clamp is active.
    """

    refused_bottoms = frozenset({1})  # LOG(FATAL): cannot backpropagate to label inputs

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        label_shape = self.bottom_shapes[1]
        if len(label_shape) > 4 or any(legacy_dim(label_shape, i) != 1 for i in (1, 2, 3)):
            raise self.error(
                "label must hold one value per item",
                expected="label channels, height and width of 1",
                got=f"label shape {label_shape}",
            )

    # a 16-bit net's loss in float32, rounded once (ops/_narrow.py)
    @computed_in_float32
    def forward(self, p: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        num = p.shape[0]
        dim = math.prod(p.shape[1:])
        labels = label.detach().reshape(num, 1).long()
        check_labels(self, labels, None, dim)
        picked = p.reshape(num, dim).gather(1, labels)
        return -log_clamped(picked, LOG_THRESHOLD).sum() / num
