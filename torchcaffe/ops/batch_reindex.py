"""BatchReindex: gather items of the batch by an index blob (repeats allowed)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from ._loss_normalization import index_checks_wanted
from .base import CaffeLayer, Exactly, Shape


@register_layer("BatchReindex")
class BatchReindexLayer(CaffeLayer):
    """top[i] = bottom[int(index[i])]. Caffe type ``BatchReindex``; no params.

    Bottom 1 is a 1-D blob of float indices with 0 <= index < bottom.shape[0] (checked, as
    Caffe does, before the cast that truncates toward 0). Top shape: (len(index),) +
    bottom.shape[1:]. The gradient accumulates over repeated indices; the index bottom gets
    none.
    Differs from torch: none (index_select).
    """

    bottoms = Exactly(2)
    tops = Exactly(1)
    refused_bottoms = frozenset({1})  # CHECK: "Cannot backprop to index."

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        data, index = (tuple(int(d) for d in s) for s in bottom_shapes)
        if len(index) != 1:
            raise self.error(
                "the index bottom (bottom 1) must be 1-D", expected="1 axis", got=f"shape {index}"
            )
        return [index + data[1:]]

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        index = index.detach()
        if index.numel() and index_checks_wanted(index):
            bad = (index < 0) | ~(index < x.shape[0])
            if bool(bad.any()):
                raise self.error(
                    "index out of range for the batch",
                    expected=f"0 <= index < {x.shape[0]}",
                    got=index[bad].tolist()[:5],
                )
        return x.index_select(0, index.long())
