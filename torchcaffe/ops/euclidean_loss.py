"""EuclideanLoss: half the mean (over the batch) squared distance of two blobs."""

from __future__ import annotations

import math

import torch

from ..registry import register_layer
from ._loss_normalization import LossLayer
from ._narrow import computed_in_float32


@register_layer("EuclideanLoss")
class EuclideanLossLayer(LossLayer):
    """sum((a - b)^2) / N / 2, N = a.shape[0]. Caffe type ``EuclideanLoss``; no params.

    Bottoms: two blobs with the same first dimension and the same count per item (their
    trailing shapes may differ; values pair up in memory order). Both bottoms get gradients
    (+-(a - b) * loss_weight / N), as Caffe allows backward to either.
    Differs from torch: mse_loss(reduction="sum") / (2 N).
    """

    no_force_backward = frozenset()

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self._check_counts(*self.bottom_shapes)

    def _check_counts(self, a, b) -> None:
        if math.prod(a[1:]) != math.prod(b[1:]):
            raise self.error(
                "inputs must have the same dimension",
                expected=f"{math.prod(a[1:])} values per item (as {tuple(a)})",
                got=f"shape {tuple(b)}",
            )

    # a 16-bit net's loss in float32, rounded once (ops/_narrow.py)
    @computed_in_float32
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self._check_counts(a.shape, b.shape)
        diff = a - b.reshape(a.shape)
        return (diff * diff).sum() / a.shape[0] / 2
