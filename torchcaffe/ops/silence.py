"""Silence: consumes bottoms so they are not net outputs; produces nothing."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from .base import AtLeast, CaffeLayer, Exactly, Shape


@register_layer("Silence")
class SilenceLayer(CaffeLayer):
    """A sink. Caffe type ``Silence``; no params, no tops.

    Backward: Caffe writes zeros into each bottom's diff; here no gradient flows from this
    layer, so the bottoms' gradients are zero (or come only from their other consumers).
    Differs from torch: no torch equivalent (returns no tensors).
    """

    bottoms = AtLeast(1)
    tops = Exactly(0)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        return []

    def forward(self, *bottoms: torch.Tensor) -> tuple[()]:
        return ()
