"""Resize (brocolli fork): bilinear resize with util_img's BiLinearResizeMat coordinates."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..registry import register_layer
from ._functional.interpolate import resample2d, resize_taps
from .base import CaffeLayer, Shape


@register_layer("Resize", fork="brocolli")
class ResizeLayer(CaffeLayer):
    """Bilinear resize. Caffe type ``Resize`` (brocolli-caffe), ``resize_param``
    (ResizeLayerParameter: height, width | is_pyramid_test with out_height_scale,
    out_width_scale).

    Output (N, C, height, width), or int(out_height_scale * H) by int(out_width_scale * W)
    with is_pyramid_test (recomputed on every reshape, as in the fork). Source coordinate
    j * in / out (no half-pixel offset, so neither torch align_corners mode); the neighbour
    past the last row/column is dropped without renormalising the weights. Backward scatters
    the top diff with the same weights.
    Differs from torch: those coordinates and the dropped border weights.
    """

    param_field = "resize_param"
    restrictions = "only 4-D inputs; an output size < 1 is an error (the fork makes an empty top)"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        need = ("out_height_scale", "out_width_scale") if p.is_pyramid_test else ("height", "width")
        for field in need:
            if not p.HasField(field):
                raise self.error(
                    f"output {field.replace('_', ' ')} is required",
                    expected=f"resize_param {{ {field}: ... }}",
                    got="none",
                )
        self.output_shapes(self.bottom_shapes)

    def _out_hw(self, in_hw: Sequence[int]) -> tuple[int, int]:
        p = self.param
        if not p.is_pyramid_test:
            return int(p.height), int(p.width)
        # float scale * float size, truncated: numpy's float32 product is the same IEEE
        # rounding as Caffe's, and a traced forward (torch.export) sees plain ints
        scales = (p.out_height_scale, p.out_width_scale)
        h, w = (int(np.float32(s) * np.float32(int(n))) for s, n in zip(scales, in_hw))
        return h, w

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        if len(shape) != 4:
            raise self.error(
                "the input must have 4 axes (num, channels, height, width)",
                expected="4 axes",
                got=shape,
            )
        out = self._out_hw(shape[2:])
        if min(out) < 1:
            raise self.error("the output size must be positive", expected=">= 1 by >= 1", got=out)
        return [shape[:2] + out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        taps = [
            resize_taps(n_in, n_out, x.dtype, x.device)
            for n_in, n_out in zip(x.shape[2:], self._out_hw(x.shape[2:]))
        ]
        return resample2d(x, *taps)
