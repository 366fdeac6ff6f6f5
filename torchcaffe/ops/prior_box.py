"""PriorBox (SSD fork): the default boxes of one feature map, with their variances."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..registry import register_layer
from ._loss_normalization import legacy_dim
from .base import CaffeLayer, Exactly, Shape


def _f32(x: float) -> float:
    """``x`` rounded to float32, as the fork stores it in a ``float``."""
    return float(torch.tensor(x, dtype=torch.float32))


@register_layer("PriorBox", fork="SSD")
class PriorBoxLayer(CaffeLayer):
    """Default (prior) boxes for every cell of bottom 0, normalized by the image size.
    Caffe type ``PriorBox`` (SSD fork), ``prior_box_param``.

    Bottoms: the feature map (its height and width) and the image (its height and width,
    unless img_size or img_h/img_w). Top (1, 2, H*W*num_priors*4): row 0 the boxes [xmin,
    ymin, xmax, ymax], per cell and per min_size: min_size, sqrt(min_size * max_size), then
    each aspect ratio (and 1/ar with flip); row 1 the variances (one value repeated, or four
    per box). Sizes are truncated to int as the fork does; centers are (w + offset) * step in
    float32, step = image size / feature size unless step or step_h/step_w. Values of the
    bottoms are unused, and there is no backward, as in the fork.
    Differs from torch: no torch equivalent.
    """

    param_field = "prior_box_param"
    bottoms = Exactly(2)
    has_backward = False

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        self._check_sizes(p)
        self.aspect_ratios = self._aspect_ratios(p.aspect_ratio, p.flip)
        self.num_priors = len(self.aspect_ratios) * len(p.min_size) + len(p.max_size)
        self.box_sizes = self._box_sizes(p)
        self.variance = self._variance(p)
        self.img_hw = self._pair(p, "img_size", "img_h", "img_w", 0)
        self.step_hw = self._pair(p, "step", "step_h", "step_w", 0.0)
        self.offset, self.clip = float(p.offset), bool(p.clip)  # forward never reads the proto
        self.output_shapes(self.bottom_shapes)

    # -- LayerSetUp ------------------------------------------------------------------------
    def _check_sizes(self, p) -> None:
        if not p.min_size:
            raise self.error("must provide min_size", expected="at least one min_size", got=0)
        if any(not 0 < s < math.inf for s in p.min_size):
            raise self.error(
                "min_size must be positive and finite", expected="> 0", got=list(p.min_size)
            )
        if any(not 0 < s < math.inf for s in p.max_size):
            raise self.error(
                "max_size must be positive and finite", expected="> 0", got=list(p.max_size)
            )
        if any(not 0 < ar < math.inf for ar in p.aspect_ratio):
            # 1/0 and sqrt of a negative have no box; the fork would emit inf/nan priors
            raise self.error(
                "aspect_ratio must be positive and finite",
                expected="> 0",
                got=list(p.aspect_ratio),
            )
        if p.max_size and len(p.max_size) != len(p.min_size):
            raise self.error(
                "max_size needs one entry per min_size",
                expected=f"{len(p.min_size)} max_size",
                got=len(p.max_size),
            )
        for lo, hi in zip(p.min_size, p.max_size):
            if not hi > lo:
                raise self.error(
                    "max_size must be greater than min_size", expected=f"max_size > {lo}", got=hi
                )

    @staticmethod
    def _aspect_ratios(given: Sequence[float], flip: bool) -> list[float]:
        """1, then each new ratio (within 1e-6 of an earlier one: skipped) and its 1/ar."""
        ratios = [1.0]
        for ar in map(_f32, given):
            if all(abs(ar - r) >= 1e-6 for r in ratios):
                ratios.append(ar)
                if flip:
                    ratios.append(_f32(1.0 / ar))
        return ratios

    def _box_sizes(self, p) -> list[tuple[float, float]]:
        """(width, height) of each prior of a cell, float32 values as the fork computes them."""
        sizes = []
        for s, min_size in enumerate(p.min_size):
            side = int(min_size)  # the fork truncates the float sizes to int
            sizes.append((float(side), float(side)))
            if p.max_size:
                big = _f32(math.sqrt(side * int(p.max_size[s])))
                sizes.append((big, big))
            for ar in self.aspect_ratios[1:]:
                root = math.sqrt(ar)
                sizes.append((_f32(side * root), _f32(side / root)))
        return sizes

    def _variance(self, p) -> list[float]:
        if len(p.variance) not in (0, 1, 4):
            raise self.error(
                "variance takes one value or exactly four",
                expected="1 or 4 values",
                got=len(p.variance),
            )
        if any(not v > 0 for v in p.variance):
            raise self.error("variance must be positive", got=list(p.variance))
        return [_f32(v) for v in p.variance] or [_f32(0.1)]

    def _pair(self, p, both: str, h: str, w: str, unset):
        """(h, w) from ``both`` or from ``h``/``w`` (not both forms); ``unset`` when absent."""
        if p.HasField(h) or p.HasField(w):
            if p.HasField(both):
                raise self.error(
                    f"either {both} or {h}/{w} should be specified; not both",
                    got=f"{both}: {getattr(p, both)}",
                )
            pair = (getattr(p, h), getattr(p, w))
        elif p.HasField(both):
            pair = (getattr(p, both),) * 2
        else:
            return (unset, unset)
        if not min(pair) > 0:
            raise self.error(
                f"{both} / {h} / {w} should be larger than 0", expected="> 0", got=pair
            )
        return pair

    # -- Reshape / Forward ----------------------------------------------------------------
    def _height_width(self, shape: Shape, i: int) -> tuple[int, int]:
        """Blob::height()/width(): legacy axes 2 and 3 (1 past the last axis)."""
        if len(shape) > 4:
            raise self.error(f"bottom {i} must have at most 4 axes (N, C, H, W)", got=shape)
        return legacy_dim(shape, 2), legacy_dim(shape, 3)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        h, w = self._height_width(tuple(bottom_shapes[0]), 0)
        self._height_width(tuple(bottom_shapes[1]), 1)
        if h * w == 0:
            raise self.error(
                "bottom 0 must have a non-empty height and width", got=tuple(bottom_shapes[0])
            )
        return [(1, 2, h * w * self.num_priors * 4)]

    def _boxes(
        self, layer_hw: tuple[int, int], img_hw: tuple[int, int], device: torch.device
    ) -> torch.Tensor:
        """(H, W, num_priors, 4) float64 boxes: float32 centers, double divisions."""
        f32, f64 = torch.float32, torch.float64
        if all(self.step_hw):
            steps = [torch.tensor(s, dtype=f32, device=device) for s in self.step_hw]
        else:  # double division rounded to float, in tensors (traceable by torch.compile)
            steps = [
                (torch.tensor(i, dtype=f64, device=device) / n).to(f32)
                for i, n in zip(img_hw, layer_hw)
            ]
        offset = torch.tensor(self.offset, dtype=f32, device=device)
        cy, cx = (
            (torch.arange(n, dtype=f32, device=device) + offset) * step
            for n, step in zip(layer_hw, steps)
        )
        cx, cy = cx.double()[None, :, None], cy.double()[:, None, None]
        bw, bh = torch.tensor(self.box_sizes, dtype=f32, device=device).double().unbind(-1)
        img_h, img_w = img_hw
        parts = (
            (cx - bw / 2) / img_w,
            (cy - bh / 2) / img_h,
            (cx + bw / 2) / img_w,
            (cy + bh / 2) / img_h,
        )
        return torch.stack(torch.broadcast_tensors(*parts), -1)

    def forward(self, feat: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        layer_hw = self._height_width(tuple(feat.shape), 0)
        img_hw = self.img_hw if all(self.img_hw) else self._height_width(tuple(image.shape), 1)
        boxes = self._boxes(layer_hw, img_hw, feat.device).to(feat.dtype).reshape(-1)
        if self.clip:
            boxes = boxes.clamp(0.0, 1.0)
        var = torch.tensor(self.variance, dtype=feat.dtype, device=feat.device)
        var = var.repeat(boxes.numel() // len(self.variance))
        return torch.stack([boxes, var]).unsqueeze(0)
