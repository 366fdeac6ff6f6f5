"""Filter: keep the batch items whose selector (the last bottom) is nonzero."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import BlobWiringError
from ..registry import register_layer
from .base import AtLeast, CaffeLayer, Shape


@register_layer("Filter")
class FilterLayer(CaffeLayer):
    """Batch filtering. Caffe type ``Filter``; no params.

    Bottoms: k data blobs, then the selector, of shape (N,) or (N, 1, ...); tops: k, top t
    holding the items n of bottom t (in order) where selector[n] != 0. The top's first dim
    depends on the data: before any data (Caffe's first Reshape) it is N. Unselected items
    get a zero gradient; the selector gets none.
    Differs from torch: no single torch op (boolean indexing per bottom).
    """

    bottoms = AtLeast(2)
    tops = AtLeast(1)
    shape_depends_on_data = True

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        nb, nt = len(layer_param.bottom), len(layer_param.top)
        if nt != nb - 1:
            raise self.error(
                "Filter needs one top per bottom except the selector",
                expected=f"{nb - 1} top(s)",
                got=nt,
                cls=BlobWiringError,
            )
        self.output_shapes(self.bottom_shapes)
        # LOG(FATAL): "Layer cannot backpropagate to filter index inputs"
        self.refused_bottoms = frozenset({nb - 1})

    def check_shapes(self, bottom_shapes: Sequence[Shape]) -> None:
        selector = tuple(bottom_shapes[-1])
        if any(d != 1 for d in selector[1:]):
            raise self.error(
                "selector dimensions must be singletons (1), except the first",
                expected=f"({selector[0]}, 1, ...)",
                got=selector,
            )
        for i, shape in enumerate(bottom_shapes[:-1]):
            if shape[0] != selector[0]:
                raise self.error(
                    f"bottom {i} must have the selector's first dimension",
                    expected=selector[0],
                    got=shape[0],
                )

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        """Shapes before any data is seen, as Caffe's first Reshape: all N items kept."""
        shapes = [tuple(int(d) for d in s) for s in bottom_shapes]
        self.check_shapes(shapes)
        return shapes[:-1]

    def forward(self, *bottoms: torch.Tensor):
        self.check_shapes([tuple(b.shape) for b in bottoms])
        keep = (bottoms[-1].detach().reshape(-1) != 0).nonzero().reshape(-1)
        tops = tuple(b.index_select(0, keep) for b in bottoms[:-1])
        return tops if len(tops) > 1 else tops[0]
