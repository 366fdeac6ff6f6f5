"""PixelShuffle (brocolli-caffe): depth to space."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..registry import register_layer
from .base import CaffeLayer, Shape


@register_layer("PixelShuffle", fork="brocolli")
class PixelShuffleLayer(CaffeLayer):
    """Depth to space. Caffe type ``PixelShuffle`` (brocolli-caffe), ``pixelshuffle_param``
    (upscale_factor r: required).

    N x C x H x W -> N x C/r^2 x rH x rW; output (p, i*r + sh, j*r + sw) reads input channel
    p*r^2 + sh*r + sw at (i, j). The fork checks only C % r == 0: with C % r^2 != 0 the
    trailing channels are left out, as there. Forward only: the fork's backward is empty, so
    no gradient flows through (as there). Differs from torch: none (F.pixel_shuffle).
    """

    param_field = "pixelshuffle_param"
    has_backward = False

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        if not self.param.HasField("upscale_factor") or self.param.upscale_factor <= 0:
            raise self.error(
                "upscale_factor must be set and positive",
                expected="pixelshuffle_param { upscale_factor: r > 0 }",
                got=self.param.upscale_factor,
            )
        self.r = int(self.param.upscale_factor)
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        if len(shape) != 4:
            raise self.error("bottom must be 4-D", expected="N x C x H x W", got=list(shape))
        n, c, h, w = shape
        if c % self.r:
            raise self.error(
                "channels must be divisible by upscale_factor", expected=f"C % {self.r} == 0", got=c
            )
        return [(n, c // (self.r * self.r), h * self.r, w * self.r)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        used = (x.shape[1] // (self.r * self.r)) * self.r * self.r
        return F.pixel_shuffle(x.detach()[:, :used], self.r)
