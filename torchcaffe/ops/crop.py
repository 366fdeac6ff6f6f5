"""Crop: cut bottom 0 to the shape of bottom 1 from ``axis`` on, at the given offsets."""

from __future__ import annotations

import torch

from ..registry import register_layer
from .base import CaffeLayer, Exactly, canonical_axis


@register_layer("Crop")
class CropLayer(CaffeLayer):
    """Crop to a reference shape. Caffe type ``Crop``, ``crop_param``.

    Output: bottom 0's shape before ``axis``, bottom 1's from ``axis`` on. Axis i >= axis
    starts at ``offset`` (one value for every cropped axis, or one per cropped axis; default
    0). Bottom 1 only supplies the shape: it gets no gradient.
    Differs from torch: no single torch op (a narrow per cropped axis).
    """

    param_field = "crop_param"
    bottoms = Exactly(2)

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        ndim = len(self.bottom_shapes[0])
        self.axis = canonical_axis(self, p.axis, ndim)
        self.offsets_given = list(p.offset)
        if len(self.offsets_given) > 1 and self.axis + len(self.offsets_given) != ndim:
            raise self.error(
                "number of offset values must equal the number of axes from axis on",
                expected=ndim - self.axis,
                got=len(self.offsets_given),
            )
        self.plan(self.bottom_shapes[0], self.bottom_shapes[1])

    def plan(self, shape, ref) -> list[tuple[int, int, int]]:
        """(axis, offset, size) for every cropped axis, checked against the bottom."""
        if len(ref) < len(shape):
            raise self.error(
                "bottom 1 needs at least as many axes as bottom 0",
                expected=f">= {len(shape)} axes",
                got=len(ref),
            )
        given = self.offsets_given
        cuts = []
        for i in range(self.axis, len(shape)):
            off = 0 if not given else given[0] if len(given) == 1 else given[i - self.axis]
            if shape[i] - off < ref[i]:
                raise self.error(
                    f"the crop for axis {i} is out of bounds",
                    expected=f"offset {off} + size {ref[i]} <= {shape[i]}",
                    got=f"bottom size {shape[i]}",
                )
            cuts.append((i, off, ref[i]))
        return cuts

    def forward(self, x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        for axis, off, size in self.plan(tuple(x.shape), tuple(ref.shape)):
            x = x.narrow(axis, off, size)
        return x
