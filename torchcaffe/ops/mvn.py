"""MVN: mean-variance normalization per sample (and channel)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from ._functional.mvn import caffe_mvn
from ._legacy import legacy_nchw
from .base import CaffeLayer, Shape


@register_layer("MVN")
class MVNLayer(CaffeLayer):
    """y = (x - mean) [/ (std + eps)]. Caffe type ``MVN``, ``mvn_param`` (normalize_variance =
    true, across_channels = false, eps = 1e-9).

    Statistics over each (n, c) slice, or each sample n with ``across_channels``; std is the
    biased one, and eps is added to it after the square root. Bottom: 1 to 4 axes, top: the
    legacy 4-D shape (num, channels, height, width), so a (N, C) bottom gives (N, C, 1, 1).
    Differs from torch: eps outside the square root; with normalize_variance the backward is
    Caffe's (every term divided by std + eps), not the exact derivative when eps != 0, and in
    place it is Caffe's, computed over the top diff it overwrites (not a gradient at all).
    """

    param_field = "mvn_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        self.normalize_variance = p.normalize_variance
        self.across_channels = p.across_channels
        self.eps = p.eps
        # in place, Caffe's Backward overwrites the top diff while reading it (CaffeMVNInPlace)
        self.in_place = list(layer_param.top[:1]) == list(layer_param.bottom[:1])
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        return [legacy_nchw(self, bottom_shapes[0])]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, c, h, w = legacy_nchw(self, x.shape)
        # the batch is left to -1: a traced or exported one stays symbolic
        rows = x.reshape(-1, c * h * w if self.across_channels else h * w)
        if self.normalize_variance:
            y = caffe_mvn(rows, self.eps, self.in_place)
        else:
            y = rows - rows.mean(dim=1, keepdim=True)
        return y.reshape(-1, c, h, w)
