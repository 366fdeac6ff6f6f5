"""Split: copies one blob to several tops (Caffe inserts these for blobs read twice)."""

from __future__ import annotations

from ..registry import register_layer
from .base import AtLeast, CaffeLayer, Exactly


@register_layer("Split")
class SplitLayer(CaffeLayer):
    """Fan-out. Caffe type ``Split``; no params. Backward sums the top diffs."""

    bottoms = Exactly(1)
    tops = AtLeast(1)

    def output_shapes(self, bottom_shapes):
        return [tuple(int(d) for d in bottom_shapes[0])] * self.num_tops

    def forward(self, x):
        # Distinct view objects so each top gets its own autograd node (and own diff).
        tops = tuple(x.view_as(x) for _ in range(self.num_tops))
        return tops if len(tops) > 1 else tops[0]
