"""Axpy (SENet): a per-(sample, channel) scale times x, plus y, in one layer."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from .base import CaffeLayer, Exactly, Shape


@register_layer("Axpy", fork="SENet")
class AxpyLayer(CaffeLayer):
    """top = a * x + y. Caffe type ``Axpy`` (SENet fork), no params message.

    Bottoms (a, x, y): a is (N, C) or (N, C, 1, 1) (its first two axes those of x), x and y
    share one shape with at least 2 axes; a[n, c] scales the slice x[n, c, ...]. Top: y's
    shape. Backward: a gets sum over the slice of top_diff * x, x gets a * top_diff, y gets
    top_diff.
    Differs from torch: none (broadcast multiply-add).
    """

    bottoms = Exactly(3)
    restrictions = (
        "a with axes past the second that are not 1 (Caffe checks only the "
        "4-axis case and then reads the first N*C values)"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        a, x, y = (tuple(int(d) for d in s) for s in bottom_shapes)
        if len(x) < 2 or len(a) < 2 or a[:2] != x[:2] or any(d != 1 for d in a[2:]):
            raise self.error(
                "bottom[0] (the scale a) must be (N, C) or (N, C, 1, 1) with "
                "N, C the first axes of bottom[1] (x)",
                expected=f"(N, C) = {x[:2]} for x of shape {list(x)}",
                got=list(a),
            )
        if x != y:
            raise self.error(
                "bottom[1] (x) and bottom[2] (y) must have the same shape",
                expected=list(x),
                got=list(y),
            )
        return [x]

    def forward(self, a: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # shapes were checked by output_shapes (the net's infer_shapes, once per input shape)
        # a's axes past the second are 1: new trailing axes of size 1, not a reshape, whose
        # shape torch.onnx's TorchScript exporter may fold into the traced batch
        scale = a[(...,) + (None,) * (x.dim() - a.dim())]
        return scale * x + y
