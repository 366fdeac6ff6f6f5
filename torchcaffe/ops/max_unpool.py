"""MaxUnPool (brocolli fork): put each pooled value back at its max-pooling argmax."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from ._functional.unpool import check_mask_range, unpool_forward
from .base import CaffeLayer, Exactly, Shape


@register_layer("MaxUnPool", fork="brocolli")
class MaxUnPoolLayer(CaffeLayer):
    """Max-unpooling. Caffe type ``MaxUnPool`` (brocolli-caffe), ``max_unpool_param``
    (dst_h, dst_w: both required).

    Bottoms: the pooled (N, C, H, W) values and the mask top of a MAX Pooling layer (flat
    h * dst_w + w index per element, same shape). Output (N, C, dst_h, dst_w): zeros, with each
    value written at its index; where two share an index the later one wins.
    Differs from torch: ``F.max_unpool2d`` leaves shared indices unordered; the fork has no
    backward (its Backward_cpu is empty), so no gradient flows.
    """

    param_field = "max_unpool_param"
    bottoms = Exactly(2)
    has_backward = False
    restrictions = (
        "a mask index outside [0, dst_h * dst_w) is an error (the fork aborts "
        "or, if negative, writes out of bounds)"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if not (p.HasField("dst_h") and p.HasField("dst_w")):
            raise self.error(
                "dst_h and dst_w are required",
                expected="max_unpool_param { dst_h: H dst_w: W }",
                got=f"dst_h {'set' if p.HasField('dst_h') else 'missing'}, "
                f"dst_w {'set' if p.HasField('dst_w') else 'missing'}",
            )
        if p.dst_h < 1 or p.dst_w < 1:
            raise self.error(
                "dst_h and dst_w must be positive", expected=">= 1", got=(p.dst_h, p.dst_w)
            )
        self.dst = (int(p.dst_h), int(p.dst_w))
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        data, mask = (tuple(int(d) for d in s) for s in bottom_shapes[:2])
        if len(data) != 4:
            raise self.error(
                "the input must have 4 axes (num, channels, height, width)",
                expected="4 axes",
                got=data,
            )
        if mask != data:
            raise self.error(
                "the mask (bottom 1) must have the shape of the data (bottom 0)",
                expected=data,
                got=mask,
            )
        return [data[:2] + self.dst]

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        index = check_mask_range(mask, self.dst[0] * self.dst[1], self._range_error)
        return unpool_forward(x.detach(), index, self.dst)

    def _range_error(self, got):
        return self.error(
            "unpool top index out of range",
            hint="check dst_h/dst_w match the input of the pooling layer that made the mask",
            expected=f"0 <= index < dst_h * dst_w ({self.dst[0] * self.dst[1]})",
            got=got,
        )
