"""Im2col: unfold convolution windows into channels, in Caffe's column layout."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..registry import register_layer
from ._conv_geometry import conv_geometry, im2col_nd
from .base import CaffeLayer


@register_layer("Im2col")
class Im2colLayer(CaffeLayer):
    """Caffe's im2col as a layer. Caffe type ``Im2col``, ``convolution_param`` (geometry only:
    kernel/stride/pad/dilation in any of their forms, ``axis``).

    Output: the bottom's shape with channels * prod(kernel) at ``axis`` and the convolution
    output size (in + 2 * pad - extent) / stride + 1 on each spatial axis. Column row
    (c * kh + i) * kw + j holds channel c at kernel offset (i, j) (channel-major).
    Differs from torch: F.unfold's layout, but spatial axes stay separate and any number of
    spatial axes (>= 1) is allowed.
    """

    param_field = "convolution_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        shape = self.bottom_shapes[0]
        self.geom = conv_geometry(self, self.param, shape, min_spatial=1)
        self._out_spatial(shape[self.geom.channel_axis + 1 :])

    def _out_spatial(self, spatial) -> tuple[int, ...]:
        out = self.geom.conv_output(spatial)
        if any(o <= 0 for o in out):
            raise self.error(
                "output size is not positive for this bottom",
                expected="every output dim > 0",
                got=f"{out} from spatial {tuple(spatial)}",
            )
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.geom
        axis = g.channel_axis
        if x.dim() != axis + 1 + g.num_spatial:
            raise self.error(
                "bottom num_axes may not change", expected=axis + 1 + g.num_spatial, got=x.dim()
            )
        lead, channels, spatial = x.shape[:axis], x.shape[axis], tuple(x.shape[axis + 1 :])
        out = self._out_spatial(spatial)
        xs = x.reshape(math.prod(lead), channels, *spatial)
        if g.num_spatial == 2 and not any(g.extra_pad(spatial)):
            cols = F.unfold(xs, g.kernel, g.dilation, g.pad, g.stride)
        else:
            cols = im2col_nd(xs, g)
        return cols.reshape(*lead, channels * math.prod(g.kernel), *out)
