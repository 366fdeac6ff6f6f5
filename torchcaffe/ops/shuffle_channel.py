"""ShuffleChannel (ShuffleNet fork): interleave the channels of ``group`` groups."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from .base import CaffeLayer, Shape


@register_layer("ShuffleChannel", fork="ShuffleNet")
class ShuffleChannelLayer(CaffeLayer):
    """Channel shuffle. Caffe type ``ShuffleChannel`` (ShuffleNet fork, merged into several
    others), ``shuffle_channel_param`` (group = 1).

    Channels seen as a group x (C / group) matrix are transposed: output channel
    ``j * group + i`` is input channel ``i * (C / group) + j``; the same as Reshape to 5-D,
    Permute (0, 2, 1, 3, 4), Reshape back. C must be divisible by group. Backward applies the
    inverse shuffle. Differs from torch: none (torch.nn.functional.channel_shuffle's order).
    """

    param_field = "shuffle_channel_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self.group = int(self.param.group)
        if self.group <= 0:
            raise self.error("group must be greater than 0", expected="group > 0", got=self.group)
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        if len(shape) < 2:
            raise self.error(
                "bottom must have a channel axis", expected="N x C x ...", got=list(shape)
            )
        if shape[1] % self.group:
            raise self.error(
                "channels must be divisible by group",
                expected=f"C % {self.group} == 0",
                got=shape[1],
            )
        return [shape]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c = x.shape[:2]
        rest = x.shape[2:]
        grouped = x.reshape(n, self.group, c // self.group, *rest)
        return grouped.transpose(1, 2).reshape(x.shape)
