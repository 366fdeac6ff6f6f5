"""Tile: repeat the bottom ``tiles`` times along one axis."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from .base import CaffeLayer, Shape, canonical_axis


@register_layer("Tile")
class TileLayer(CaffeLayer):
    """Tiling. Caffe type ``Tile``, ``tile_param`` (axis = 1, tiles: required, > 0).

    Output: shape[axis] * tiles along axis; the block shape[axis:] is copied ``tiles`` times
    for each index of shape[:axis] (torch's repeat). Backward sums the copies.
    Differs from torch: none (Tensor.repeat).
    """

    param_field = "tile_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if not p.HasField("tiles"):
            raise self.error(
                "the number of tiles must be specified",
                expected="tile_param { tiles: N }",
                got="no tiles",
            )
        if p.tiles <= 0:
            raise self.error(
                "the number of tiles must be positive", expected="tiles > 0", got=p.tiles
            )
        self.tiles = p.tiles
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = list(int(d) for d in bottom_shapes[0])
        axis = canonical_axis(self, self.param.axis, len(shape))
        shape[axis] *= self.tiles
        return [tuple(shape)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        axis = canonical_axis(self, self.param.axis, x.dim())
        reps = [1] * x.dim()
        reps[axis] = self.tiles
        return x.repeat(*reps)
