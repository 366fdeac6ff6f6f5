"""ContrastiveLoss: Hadsell et al.'s siamese loss over pairs of embeddings."""

from __future__ import annotations

import math

import torch

from ..registry import register_layer
from ._functional.contrastive import caffe_pair_distance
from ._loss_normalization import LossLayer, legacy_dim
from ._narrow import computed_in_float32
from .base import Exactly


@register_layer("ContrastiveLoss")
class ContrastiveLossLayer(LossLayer):
    """sum_n (y_n d_n^2 + (1 - y_n) max(margin - d_n, 0)^2) / N / 2, d_n = ||a_n - b_n||.
    Caffe type ``ContrastiveLoss``, ``contrastive_loss_param`` (margin, legacy_version).

    Bottoms: a and b of shape (N, C) or (N, C, 1, 1), and the similarity y (N values; a
    pair is similar when y truncates to a nonzero integer). ``legacy_version: true`` uses
    max(margin - d_n^2, 0) for dissimilar pairs. a and b both get gradients, y none.
    Differs from torch: the dissimilar-pair gradient divides by d_n + 1e-4, as Caffe does.
    """

    param_field = "contrastive_loss_param"
    bottoms = Exactly(3)
    no_force_backward = frozenset({2})

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        a, b, y = self.bottom_shapes
        for i, s in enumerate((a, b, y)):
            if len(s) > 4:
                raise self.error(
                    f"bottom {i} must have at most 4 axes", expected="<= 4", got=len(s)
                )
        checks = [("bottom 1 channels", legacy_dim(b, 1), legacy_dim(a, 1))]
        checks += [
            (f"bottom {i} {name}", legacy_dim(s, k), 1)
            for i, s in enumerate((a, b))
            for k, name in ((2, "height"), (3, "width"))
        ]
        checks += [
            (f"bottom 2 {name}", legacy_dim(y, k), 1)
            for k, name in ((1, "channels"), (2, "height"), (3, "width"))
        ]
        for what, got, want in checks:
            if got != want:
                raise self.error(f"{what} mismatch", expected=want, got=got)
        if legacy_dim(y, 0) < legacy_dim(a, 0):
            raise self.error(
                "bottom 2 needs one similarity value per pair",
                expected=f">= {legacy_dim(a, 0)} values",
                got=legacy_dim(y, 0),
            )
        p = self.param
        self.margin = p.margin
        self.legacy_version = p.legacy_version

    # a 16-bit net's loss in float32, rounded once (ops/_narrow.py)
    @computed_in_float32
    def forward(self, a: torch.Tensor, b: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        num = a.shape[0]
        diff = (a - b.reshape(a.shape)).reshape(num, math.prod(a.shape[1:]))  # num may be 0
        dist_sq = (diff * diff).sum(dim=1)
        similar = y.detach().reshape(-1)[:num].long() != 0
        if self.legacy_version:
            dissimilar = torch.relu(self.margin - dist_sq)
        else:
            gap = torch.relu(self.margin - caffe_pair_distance(dist_sq))
            dissimilar = gap * gap
        return torch.where(similar, dist_sq, dissimilar).sum() / num / 2
