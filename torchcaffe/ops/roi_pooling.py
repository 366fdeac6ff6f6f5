"""ROIPooling: Fast/Faster R-CNN max pooling of each ROI onto a fixed pooled_h x pooled_w grid.

Reference: rbgirshick/caffe-fast-rcnn, src/caffe/layers/roi_pooling_layer.cpp and .cu.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from .. import limits
from ..registry import register_layer
from ._roi import CHUNK_ELEMENTS, c_round, check_roi_bottoms, roi_batch_index
from .base import Arity, CaffeLayer, Exactly, Shape

FLT_MAX = 3.4028234663852886e38


@register_layer("ROIPooling", fork="Fast/Faster R-CNN")
class ROIPoolingLayer(CaffeLayer):
    """ROI max pooling. Caffe type ``ROIPooling``, ``roi_pooling_param`` (pooled_h, pooled_w
    > 0; spatial_scale = 1).

    Bottoms: features N x C x H x W and rois R x 5 rows ``[n x1 y1 x2 y2]`` in image pixels.
    Output: R x C x pooled_h x pooled_w. Each ROI corner is ``round(coord * spatial_scale)``
    (C rounding, halves away from zero), the ROI is at least 1x1, bin ``ph`` spans rows
    ``[floor(ph * h / pooled_h), ceil((ph + 1) * h / pooled_h))`` offset by the ROI start and
    clipped to the map; an empty bin outputs 0. The max takes the first maximum in row-major
    order and only values > -FLT_MAX (NaN never wins; a bin with none outputs -FLT_MAX).
    Backward (Caffe's GPU kernel; the CPU one is NOT_IMPLEMENTED): each top diff goes to its
    argmax element only when that element lies inside the unclipped, rounded ROI and the
    kernel's float bin range around it holds the bin. So a malformed ROI (end < start, pooled
    as 1x1) and a last bin that float rounding stretches one past the ROI end pass no
    gradient. rois get no gradient; a batch index outside [0, N) is an error (Caffe's CPU
    forward CHECKs it).
    Differs from torch: no torch op; bin maxima come from a sparse table of block maxima,
    which tracks argmax positions only when x needs a gradient.
    """

    bottoms: ClassVar[Arity] = Exactly(2)
    param_field = "roi_pooling_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        for field in ("pooled_h", "pooled_w"):
            if getattr(p, field) <= 0:
                raise self.error(
                    f"{field} must be > 0", expected=f"{field} > 0", got=getattr(p, field)
                )
        self.pooled_h, self.pooled_w = int(p.pooled_h), int(p.pooled_w)
        self.spatial_scale = float(p.spatial_scale)
        check_roi_bottoms(self, self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        check_roi_bottoms(self, bottom_shapes)
        n_rois, channels = bottom_shapes[1][0], bottom_shapes[0][1]
        height, width = bottom_shapes[0][2], bottom_shapes[0][3]
        # forward/backward hold an R x pooled x size mask per axis, besides the top itself
        for field, pooled, size in (
            ("pooled_h", self.pooled_h, height),
            ("pooled_w", self.pooled_w, width),
        ):
            problem = limits.shape_problem((max(int(n_rois), 1), pooled, max(int(size), 1)))
            if problem:
                raise self.error(
                    f"{field} {pooled} needs a bin mask of {problem}",
                    expected=f"{field} near the bottom's {size}",
                    got=pooled,
                )
        return [(n_rois, channels, self.pooled_h, self.pooled_w)]

    def _axis(self, rois: torch.Tensor, dtype: torch.dtype, pooled: int, axis: int, size: int):
        """One axis (0: x/w, 1: y/h) of every ROI: its rounded start and end (unclipped), the
        bin size, and the [lo, hi) rows or columns of each bin, clipped to the map."""
        scale = torch.tensor(self.spatial_scale, dtype=dtype, device=rois.device)
        start = c_round(rois[:, 1 + axis] * scale).long()
        end = c_round(rois[:, 3 + axis] * scale).long()
        bin_size = (end - start + 1).clamp_min(1).to(dtype) / pooled
        p = torch.arange(pooled, dtype=dtype, device=rois.device)
        lo = torch.floor(p * bin_size[:, None]).long() + start[:, None]
        hi = torch.ceil((p + 1) * bin_size[:, None]).long() + start[:, None]
        return start, end, bin_size, lo.clamp(0, size), hi.clamp(0, size)

    @staticmethod
    def _feasible(start, end, bin_size, pooled: int, size: int) -> torch.Tensor:
        """R x pooled x size: whether Caffe's backward lets bin p send a diff to row (or
        column) i: i inside the unclipped ROI, and p in the kernel's float range for i."""
        i = torch.arange(size, device=start.device)
        rel = (i - start[:, None]).to(bin_size.dtype)  # R x size
        first = torch.floor(rel / bin_size[:, None]).long().clamp(0, pooled)
        last = torch.ceil((rel + 1) / bin_size[:, None]).long().clamp(0, pooled)
        inside = (i >= start[:, None]) & (i <= end[:, None])
        p = torch.arange(pooled, device=start.device)[None, :, None]
        return inside[:, None] & (p >= first[:, None]) & (p < last[:, None])

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        ph, pw = self.pooled_h, self.pooled_w
        rois = rois.detach().reshape(-1, 5).to(x.dtype)
        need_grad = torch.is_grad_enabled() and x.requires_grad
        with torch.no_grad():
            batch = roi_batch_index(self, rois, n)
            sh, eh, bin_h, hs, he = self._axis(rois, x.dtype, ph, 1, h)
            sw, ew, bin_w, ws, we = self._axis(rois, x.dtype, pw, 0, w)
            empty = (he <= hs)[:, :, None] | (we <= ws)[:, None, :]  # R x ph x pw
            fill = torch.where(empty[:, None], 0.0, -FLT_MAX).to(x.dtype)
            best, arg = bin_max(x.detach(), batch, hs, he, ws, we, need_grad)
            if arg is None:
                return torch.where(best > float("-inf"), best, fill)
            at = arg.clamp_min(0)
            r = torch.arange(arg.shape[0], device=x.device)[:, None, None, None]
            rows = self._feasible(sh, eh, bin_h, ph, h).reshape(-1)
            cols = self._feasible(sw, ew, bin_w, pw, w).reshape(-1)
            p = torch.arange(ph, device=x.device)[:, None]
            q = torch.arange(pw, device=x.device)
            routed = (arg >= 0) & rows[(r * ph + p) * h + at // w] & cols[(r * pw + q) * w + at % w]
            chan = torch.arange(c, device=x.device)[None, :, None, None]
            flat = (batch[:, None, None, None] * c + chan) * (h * w) + at
        out = x.reshape(-1)[flat]
        out = torch.where(routed, out, out.detach())  # Caffe's backward skips the rest
        return torch.where(arg >= 0, out, fill)


def _log2(n: torch.Tensor) -> torch.Tensor:
    """floor(log2(n)) for n >= 1 (0 for n < 1)."""
    return torch.floor(torch.log2(n.clamp_min(1).double())).long()


def _pick(v1, i1, v2, i2):
    """Caffe's running max: the larger value, on a tie the earlier (row-major) position.
    Without positions (i1 None), just the larger value."""
    if i1 is None:
        return torch.maximum(v1, v2), None
    take = (v2 > v1) | ((v2 == v1) & (i2 < i1))
    return torch.where(take, v2, v1), torch.where(take, i2, i1)


def _shifted(t: torch.Tensor | None, dim: int, half: int, value: float):
    """t advanced by ``half`` along ``dim`` (1: rows, 2: columns), padded with ``value``."""
    if t is None:
        return None
    pad = [0, 0] * (t.dim() - 1 - dim) + [0, half]
    return torch.nn.functional.pad(t.narrow(dim, half, t.shape[dim] - half), pad, value=value)


def bin_max(x, batch, hs, he, ws, we, with_index: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Max of x[batch] over every bin (-inf if none) and, ``with_index``, its row-major first
    position (flat h * W + w, -1 if none); R x C x ph x pw each.

    A 2-D sparse table: level (a, b) holds the max of each 2^a x 2^b block, so every bin is
    the union of four (overlapping) blocks. Values not > -FLT_MAX (and NaN) never win.
    """
    n, c, h, w = x.shape
    big = h * w  # position of "no candidate"
    pos = torch.arange(h * w, device=x.device, dtype=torch.int32).view(1, h, w, 1)
    kh, kw = _log2(he - hs), _log2(we - ws)  # R x ph, R x pw
    levels_h = int(kh.max()) + 1 if kh.numel() else 1
    levels_w = int(kw.max()) + 1 if kw.numel() else 1
    r, ph, pw = hs.shape[0], hs.shape[1], ws.shape[1]
    out_v = torch.empty((r, c, ph, pw), dtype=x.dtype, device=x.device)
    out_i = torch.empty((r, c, ph, pw), dtype=torch.long, device=x.device) if with_index else None
    empty = ((he <= hs)[:, :, None] | (we <= ws)[:, None, :])[..., None]  # R x ph x pw x 1
    # bin corners of the four blocks (R x ph x pw each); empty bins read the border (masked)
    h0 = hs[:, :, None].clamp(0, h - 1)
    h1 = (he - (torch.ones_like(kh) << kh))[:, :, None].clamp(0, h - 1)
    w0 = ws[:, None, :].clamp(0, w - 1)
    w1 = (we - (torch.ones_like(kw) << kw))[:, None, :].clamp(0, w - 1)
    lev = kh[:, :, None] * levels_w + kw[:, None, :]  # R x ph x pw
    per_channel = n * h * w * levels_h * levels_w * (2 if with_index else 1)
    step = max(1, CHUNK_ELEMENTS // max(per_channel, 1))
    for c0 in range(0, c, step):
        xc = x[:, c0 : c0 + step].permute(0, 2, 3, 1)  # N x H x W x c
        ok = xc > -FLT_MAX
        val = torch.where(ok, xc, float("-inf"))
        idx = torch.where(ok, pos, big).expand_as(xc) if with_index else None
        rows_v: list[torch.Tensor] = []
        rows_i: list[torch.Tensor] = []
        for a in range(levels_h):
            cols_v: list[Any] = [val]
            cols_i: list[Any] = [idx]
            for b in range(1, levels_w):
                half = 1 << (b - 1)
                nv, ni = _pick(
                    cols_v[-1],
                    cols_i[-1],
                    _shifted(cols_v[-1], 2, half, -math.inf),
                    _shifted(cols_i[-1], 2, half, big),
                )
                cols_v.append(nv)
                cols_i.append(ni)
            rows_v.append(torch.stack(cols_v))
            if with_index:
                rows_i.append(torch.stack(cols_i))
            if a + 1 < levels_h:
                half = 1 << a
                val, idx = _pick(
                    val, idx, _shifted(val, 1, half, -math.inf), _shifted(idx, 1, half, big)
                )
        table_v = torch.stack(rows_v).reshape(-1, xc.shape[-1])  # (levels, N, H, W) rows
        table_i = torch.stack(rows_i).reshape(-1, xc.shape[-1]) if rows_i else None
        best_v: Any = None
        best_i: Any = None
        for hh in (h0, h1):
            for ww in (w0, w1):
                row = ((lev * n + batch[:, None, None]) * h + hh) * w + ww
                v, i = table_v[row], (None if table_i is None else table_i[row])
                best_v, best_i = (v, i) if best_v is None else _pick(best_v, best_i, v, i)
        best_v = best_v.masked_fill(empty, -math.inf)
        out_v[:, c0 : c0 + step] = best_v.permute(0, 3, 1, 2)
        if out_i is not None:
            best_i = torch.where(best_v > -math.inf, best_i.long(), -1)
            out_i[:, c0 : c0 + step] = best_i.permute(0, 3, 1, 2)
    return out_v, out_i
