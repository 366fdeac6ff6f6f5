"""Interp (PSPNet / DeepLab-v2 fork): bilinear resize with align-corners coordinates."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from google.protobuf import text_format

from ..registry import register_layer
from ._functional.interpolate import interp2_taps, resample2d
from .base import Between, CaffeLayer, Shape


@register_layer("Interp", fork="PSPNet, DeepLab-v2")
class InterpLayer(CaffeLayer):
    """Bilinear interpolation. Caffe type ``Interp`` (PSPNet, DeepLab-v2), ``interp_param``
    (zoom_factor, shrink_factor, height + width, pad_beg, pad_end <= 0; caffe-priv's
    use_blob_size takes height and width from a second bottom).

    The input is first cropped by -pad_beg rows/columns at the start and -pad_end at the
    end (both axes), to H_eff x W_eff. Output size, by the first rule that applies:
    use_blob_size: bottom 1's H x W; shrink only: (H_eff - 1) / shrink + 1; zoom only:
    H_eff + (H_eff - 1) * (zoom - 1); height and width; shrink then zoom.
    Source coordinate j * (H_eff - 1) / (H_out - 1) in float (torch's align_corners=True);
    a same-size output is a plain copy. Backward scatters the top diff with the same weights.
    Differs from torch: the float coordinate arithmetic (at any dtype) and the cropping.
    """

    param_field = "interp_param"
    bottoms = Between(1, 2)
    no_force_backward = frozenset({1})  # the size reference

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if p.pad_beg > 0 or p.pad_end > 0:
            raise self.error(
                "only non-positive padding (cropping) is supported by the fork",
                expected="pad_beg <= 0 and pad_end <= 0",
                got=(p.pad_beg, p.pad_end),
            )
        if p.use_blob_size != (len(bottom_shapes) == 2):
            raise self.error(
                "use_blob_size and a second bottom go together",
                expected="use_blob_size: true with 2 bottoms, else 1 bottom",
                got=f"use_blob_size: {str(p.use_blob_size).lower()} with "
                f"{len(bottom_shapes)} bottom(s)",
            )
        # read once: forward must not touch the proto (torch.compile cannot trace HasField)
        self.pad_beg, self.pad_end = int(p.pad_beg), int(p.pad_end)
        self.use_blob_size = bool(p.use_blob_size)
        self.shrink_factor = int(p.shrink_factor) if p.HasField("shrink_factor") else None
        self.zoom_factor = int(p.zoom_factor) if p.HasField("zoom_factor") else None
        has_hw = p.HasField("height") and p.HasField("width")
        self.height_width = (int(p.height), int(p.width)) if has_hw else None
        self.output_shapes(self.bottom_shapes)

    def _sizes(self, in_hw: Sequence[int], ref_hw: Sequence[int] | None):
        """-> (H_eff, W_eff), (H_out, W_out) as the fork's Reshape computes them."""
        eff = tuple(int(n) + self.pad_beg + self.pad_end for n in in_hw)
        shrink, zoom = self.shrink_factor is not None, self.zoom_factor is not None
        if self.use_blob_size:
            assert ref_hw is not None  # two bottoms, checked at set-up
            out = tuple(int(n) for n in ref_hw)
        elif shrink and not zoom:
            out = self._shrink(eff)
        elif zoom and not shrink:
            out = self._zoom(eff)
        elif self.height_width is not None:
            out = self.height_width
        elif shrink and zoom:
            out = self._zoom(self._shrink(eff))
        else:
            raise self.error(
                "the output size is not specified",
                expected="zoom_factor, shrink_factor, or height and width",
                got=text_format.MessageToString(self.param, as_one_line=True)
                or "no interp_param fields",
            )
        if min(eff) < 1:
            raise self.error(
                "the cropped input must be non-empty",
                expected="H, W > 0 after pad_beg/pad_end",
                got=eff,
            )
        if min(out) < 1:
            raise self.error("the output size must be positive", expected="> 0", got=out)
        return eff, out

    def _shrink(self, hw):
        factor = int(self.shrink_factor or 0)
        if factor < 1:
            raise self.error("shrink_factor must be positive", expected=">= 1", got=factor)
        return tuple((n - 1) // factor + 1 for n in hw)

    def _zoom(self, hw):
        factor = int(self.zoom_factor or 0)
        if factor < 1:
            raise self.error("zoom_factor must be positive", expected=">= 1", got=factor)
        return tuple(n + (n - 1) * (factor - 1) for n in hw)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        if len(shape) != 4:
            raise self.error(
                "the input must have 4 axes (num, channels, height, width)",
                expected="4 axes",
                got=shape,
            )
        ref = None
        if len(bottom_shapes) == 2:
            ref = tuple(int(d) for d in bottom_shapes[1])
            if len(ref) != 4:
                raise self.error(
                    "the size reference (bottom 1) must have 4 axes", expected="4 axes", got=ref
                )
            ref = ref[2:]
        return [shape[:2] + self._sizes(shape[2:], ref)[1]]

    def forward(self, x: torch.Tensor, ref: torch.Tensor | None = None) -> torch.Tensor:
        eff, out = self._sizes(x.shape[2:], None if ref is None else ref.shape[2:])
        begin = -self.pad_beg
        x = x[:, :, begin : begin + eff[0], begin : begin + eff[1]]
        if eff == out:  # the fork's special case: just copy
            return x.clone()
        taps = [interp2_taps(n_in, n_out, x.dtype, x.device) for n_in, n_out in zip(eff, out)]
        return resample2d(x, *taps)
