"""BilinearInterpolate (brocolli fork): bilinear resize of H and W, torch-style coordinates."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from ._functional.interpolate import bilinear_interpolate_taps, resample2d
from .base import CaffeLayer, Shape


@register_layer("BilinearInterpolate", fork="brocolli")
class BilinearInterpolateLayer(CaffeLayer):
    """Bilinear interpolation. Caffe type ``BilinearInterpolate`` (brocolli-caffe),
    ``bilinear_interpolate_param`` (dst_h, dst_w | scale_factor = 1, align_corners = true).

    Output (N, C, dst_h, dst_w), fixed at setup: dst_h / dst_w (a missing one keeps the input
    size), or int(H * scale_factor) by int(W * scale_factor); setting both kinds, or neither,
    leaves the fork's size undefined and is an error. Source coordinates as torch's
    ``F.interpolate(mode="bilinear")`` for that align_corners, in the fork's precision.
    Differs from torch: no backward (the fork's Backward_cpu is empty).
    """

    param_field = "bilinear_interpolate_param"
    has_backward = False
    restrictions = (
        "dst_h/dst_w together with scale_factor, or neither, is an error (the fork "
        "leaves the size uninitialised); an output size < 1 is an error; "
        "align_corners with an output size of 1 is an error (the fork divides by "
        "zero and outputs NaN)"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        shape = self.bottom_shapes[0]
        self._check_axes(shape)
        has_dst = p.HasField("dst_h") or p.HasField("dst_w")
        if has_dst == p.HasField("scale_factor"):
            raise self.error(
                "give the output size by dst_h/dst_w or by scale_factor",
                expected="exactly one of the two",
                got="both" if has_dst else "neither",
            )
        dst: tuple[int, ...]
        if has_dst:
            dst = (
                p.dst_h if p.HasField("dst_h") else shape[2],
                p.dst_w if p.HasField("dst_w") else shape[3],
            )
        else:  # int(height * scale_factor_), float maths
            factor = torch.tensor(p.scale_factor, dtype=torch.float32)
            dst = tuple(int(torch.tensor(n, dtype=torch.float32) * factor) for n in shape[2:])
        if min(dst) < 1:
            raise self.error("the output size must be positive", expected=">= 1 by >= 1", got=dst)
        if p.align_corners and min(dst) == 1:
            raise self.error(
                "align_corners with an output height or width of 1 divides by zero in the fork",
                expected="an output size > 1",
                got=dst,
                hint="use align_corners: false",
            )
        self.dst = (int(dst[0]), int(dst[1]))
        self.align_corners = p.align_corners

    def _check_axes(self, shape: Shape) -> None:
        if len(shape) != 4:
            raise self.error(
                "the input must have 4 axes (num, channels, height, width)",
                expected="4 axes",
                got=shape,
            )

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        self._check_axes(bottom_shapes[0])  # a new shape too (set-up checked the first)
        return [tuple(int(d) for d in bottom_shapes[0][:2]) + self.dst]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach()
        taps = [
            bilinear_interpolate_taps(n_in, n_out, self.align_corners, x.dtype, x.device)
            for n_in, n_out in zip(x.shape[2:], self.dst)
        ]
        return resample2d(x, *taps)
