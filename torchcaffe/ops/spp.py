"""SPP: spatial pyramid pooling, levels of 1, 2, 4, ... bins per side, flattened and joined."""

from __future__ import annotations

import math

import torch

from ..proto import caffe_pb2
from ..registry import register_layer
from .base import CaffeLayer
from .pooling import PP, caffe_pool2d, pooled_size

_POOL = {
    caffe_pb2.SPPParameter.MAX: PP.MAX,
    caffe_pb2.SPPParameter.AVE: PP.AVE,
    caffe_pb2.SPPParameter.STOCHASTIC: PP.STOCHASTIC,
}


@register_layer("SPP")
class SPPLayer(CaffeLayer):
    """Spatial pyramid pooling. Caffe type ``SPP``, ``spp_param``; (N, C, H, W) bottoms only.

    Level l pools with 2^l bins per side: kernel = stride = ceil(H / 2^l), pad =
    (kernel * 2^l - H + 1) // 2 (likewise for W), then Caffe's Pooling rules (ceil rounding,
    last window dropped when it starts in the padding). With pyramid_height 1 the top is that
    pooling's (N, C, h, w) output; otherwise each level is flattened to (N, C * h * w) and the
    levels are concatenated in order on axis 1. STOCHASTIC always samples: Caffe builds the
    inner Pooling layers with the default (TRAIN) phase.
    Differs from torch: no torch equivalent.
    """

    param_field = "spp_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if p.pyramid_height < 1:
            raise self.error(
                "pyramid_height must be positive", expected=">= 1", got=p.pyramid_height
            )
        self.pyramid_height = p.pyramid_height
        self.pool = _POOL[p.pool]
        self.levels(self.bottom_shapes[0])

    def levels(self, shape) -> list[tuple]:
        """Per level: (kernel, stride, pad, output size), validated as Caffe's Pooling does."""
        if len(shape) != 4:
            raise self.error(
                "input must have 4 axes (num, channels, height, width)", expected=4, got=len(shape)
            )
        hw = (shape[2], shape[3])
        if min(hw) <= 0:
            raise self.error("input dimensions cannot be zero", expected="> 0", got=hw)
        plans = []
        for level in range(self.pyramid_height):
            bins = 2**level
            kernel = tuple(math.ceil(i / bins) for i in hw)
            pad = tuple((k * bins - i + 1) // 2 for k, i in zip(kernel, hw))
            if pad != (0, 0):
                if self.pool == PP.STOCHASTIC:
                    raise self.error(
                        f"level {level} needs padding, which STOCHASTIC pooling does not implement",
                        expected="pad 0",
                        got=pad,
                    )
                if any(p >= k for p, k in zip(pad, kernel)):
                    raise self.error(
                        f"level {level} ({bins} bins) needs pad >= kernel for "
                        "this bottom; Caffe's Pooling rejects it",
                        expected=f"pad < kernel {kernel}",
                        got=f"pad {pad}",
                    )
            out = tuple(
                pooled_size(i, k, k, p, True, pad != (0, 0)) for i, k, p in zip(hw, kernel, pad)
            )
            plans.append((kernel, kernel, pad, out))
        return plans

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plans = self.levels(tuple(x.shape))
        tops = [caffe_pool2d(x, self.pool, k, s, p, o, sample=True)[0] for k, s, p, o in plans]
        if self.pyramid_height == 1:
            return tops[0]
        return torch.cat([t.flatten(1) for t in tops], dim=1)  # 4-D: a batch of 0 too
