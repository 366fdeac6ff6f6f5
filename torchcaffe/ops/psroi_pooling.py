"""PSROIPooling: R-FCN position-sensitive ROI average pooling.

Reference: daijifeng001/caffe-rfcn (= brocolli-caffe 9.0.2),
src/caffe/layers/psroi_pooling_layer.cu (the fork has no CPU forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from ..registry import register_layer
from ._roi import bin_windows, c_round, check_roi_bottoms, roi_batch_index, roi_chunks
from .base import Arity, CaffeLayer, Exactly, Shape


@register_layer("PSROIPooling", fork="R-FCN")
class PSROIPoolingLayer(CaffeLayer):
    """Position-sensitive ROI pooling. Caffe type ``PSROIPooling``, ``psroi_pooling_param``
    (spatial_scale, output_dim > 0, group_size > 0: all required).

    Bottoms: score maps N x (output_dim * group_size^2) x H x W and rois R x 5
    ``[n x1 y1 x2 y2]``. Output: R x output_dim x group_size x group_size; output
    ``(r, d, i, j)`` averages channel ``(d * group_size + i) * group_size + j`` over bin
    ``(i, j)``. ROI corners are rounded (C rounding) before scaling, the end gets +1, the ROI
    is at least 0.1 wide; bins are ``[floor(i * bin + start), ceil((i + 1) * bin + start))``
    (each edge one fused multiply-add, as nvcc compiles it; float64 rounds twice) clipped to
    the map; an empty bin outputs 0. Backward spreads ``diff / bin_area`` over
    the bin; rois get no gradient. A batch index outside [0, N) is an error (the kernel reads
    out of bounds).
    Differs from torch: no torch op (a gather of bin windows, then a mean).
    """

    bottoms: ClassVar[Arity] = Exactly(2)
    param_field = "psroi_pooling_param"
    restrictions = "in float64 the bin edges round twice where the GPU kernel fuses them"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        for field in ("spatial_scale", "output_dim", "group_size"):
            if not p.HasField(field):
                raise self.error(
                    f"psroi_pooling_param.{field} is required",
                    expected=f"psroi_pooling_param {{ {field}: ... }}",
                    got=f"no {field}",
                )
        for field in ("output_dim", "group_size"):
            if getattr(p, field) <= 0:
                raise self.error(
                    f"{field} must be > 0", expected=f"{field} > 0", got=getattr(p, field)
                )
        self.spatial_scale = float(p.spatial_scale)
        self.output_dim, self.group_size = int(p.output_dim), int(p.group_size)
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        check_roi_bottoms(self, bottom_shapes)
        g, d = self.group_size, self.output_dim
        if bottom_shapes[0][1] != d * g * g:
            raise self.error(
                "input channel number does not match layer parameters",
                expected=f"output_dim * group_size^2 = {d * g * g} channels",
                got=bottom_shapes[0][1],
            )
        return [(bottom_shapes[1][0], d, g, g)]

    def _bins(self, rois: torch.Tensor, dtype: torch.dtype, axis: int, size: int):
        """[start, end) of every bin along one axis (axis 0: x/w, 1: y/h), clipped to the map."""
        scale = torch.tensor(self.spatial_scale, dtype=dtype, device=rois.device)
        start = c_round(rois[:, 1 + axis]) * scale
        end = (c_round(rois[:, 3 + axis]) + 1) * scale
        bin_size = (end - start).clamp_min(0.1) / self.group_size
        # nvcc fuses p * bin_size + start into one FMA (a single rounding); for float32 the
        # float64 result rounded once to float32 is the same.
        wide = torch.float64 if dtype == torch.float32 else dtype
        p = torch.arange(self.group_size + 1, dtype=wide, device=rois.device)[None]
        edge = (p * bin_size[:, None].to(wide) + start[:, None].to(wide)).to(dtype)
        lo, hi = torch.floor(edge[:, :-1]).long(), torch.ceil(edge[:, 1:]).long()
        return lo.clamp(0, size), hi.clamp(0, size)

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        g, d = self.group_size, self.output_dim
        rois = rois.detach().reshape(-1, 5).to(x.dtype)
        r = rois.shape[0]
        with torch.no_grad():
            batch = roi_batch_index(self, rois, n)
            hs, he = self._bins(rois, x.dtype, 1, h)
            ws, we = self._bins(rois, x.dtype, 0, w)
            hidx, hval = bin_windows(hs, he, h)  # R x g x Kh
            widx, wval = bin_windows(ws, we, w)  # R x g x Kw
            area = ((he - hs)[:, :, None] * (we - ws)[:, None, :]).to(x.dtype)  # R x g x g
            chan = torch.arange(d * g * g, device=x.device).view(d, g, g)
        sums = []
        flat_x = x.reshape(-1)
        kh, kw = hidx.shape[-1], widx.shape[-1]
        for sl in roi_chunks(r, d * g * g * kh * kw):
            with torch.no_grad():
                base = (batch[sl, None, None, None] * c + chan) * h  # r x d x g x g
                index = (base[..., None, None] + hidx[sl, None, :, None, :, None]) * w + widx[
                    sl, None, None, :, None, :
                ]  # r x d x g x g x Kh x Kw
                valid = hval[sl, None, :, None, :, None] & wval[sl, None, None, :, None, :]
            vals = torch.where(valid, flat_x[index], 0.0)
            sums.append(vals.sum(dim=(-2, -1)))
        # no ROI: an empty top that autograd still links to x (a loss over it backpropagates
        # zeros, as Caffe's Backward over no ROI leaves the bottom diff zero)
        total = torch.cat(sums) if sums else x.reshape(-1)[:0].reshape(0, d, g, g)
        empty = area[:, None] <= 0
        return torch.where(empty, 0.0, total / area[:, None].clamp_min(1))
