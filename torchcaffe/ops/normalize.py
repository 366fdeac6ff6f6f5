"""Normalize (SSD): L2-normalize each sample or each position, then scale per channel."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..proto import caffe_pb2
from ..registry import register_layer
from ._functional.normalize import caffe_normalize
from ._legacy import legacy_nchw
from .base import CaffeLayer, Shape


@register_layer("Normalize", fork="SSD")
class NormalizeLayer(CaffeLayer):
    """y = x / sqrt(sum x^2 + eps) * scale. Caffe type ``Normalize`` (SSD fork), ``norm_param``
    (across_spatial = true, channel_shared = true, eps = 1e-10, scale_filler: constant 1).

    The sum runs over C*H*W per sample (``across_spatial``) or over C at each position. One
    blob ``weight``: a scalar (shape ()) with ``channel_shared``, else (C,). Bottom: 2 to 4
    axes (legacy num/channels/height/width).
    Differs from torch: eps inside the square root; Caffe's backward, which with a per-channel
    scale is not the exact derivative, and whose scale diff divides by the scale.
    """

    param_field = "norm_param"

    # param blobs, registered by add_blob
    weight: torch.Tensor

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        _, channels, _, _ = legacy_nchw(self, self.bottom_shapes[0], min_axes=2)
        self.across_spatial = p.across_spatial
        self.channel_shared = p.channel_shared
        self.eps = p.eps
        filler = (
            p.scale_filler
            if p.HasField("scale_filler")
            else caffe_pb2.FillerParameter(type="constant", value=1.0)
        )
        self.add_blob("weight", () if self.channel_shared else (channels,), filler=filler)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        self._check_bottom(shape)
        return [shape]

    def _check_bottom(self, shape: Sequence[int]) -> None:
        _, channels, _, _ = legacy_nchw(self, shape, min_axes=2)
        if not self.channel_shared and channels != self.weight.shape[0]:
            raise self.error(
                "bottom channels (axis 1) differ from the scale blob",
                expected=f"shape (N, {self.weight.shape[0]}, ...)",
                got=list(shape),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_bottom(x.shape)
        _, c, h, w = legacy_nchw(self, x.shape, min_axes=2)
        rows = x.reshape(-1, c, h * w)  # batch -1: a traced or exported one stays symbolic
        y = caffe_normalize(rows, self.weight, self.across_spatial, self.eps)
        return y.reshape(x.shape)
