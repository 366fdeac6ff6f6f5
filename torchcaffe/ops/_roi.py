"""Helpers shared by ROIPooling and PSROIPooling: C rounding, ROI blobs, bin windows."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import CaffeLayer, Shape

# Elements gathered per chunk of ROIs (bounds the transient memory of a forward).
CHUNK_ELEMENTS = 1 << 24


def c_round(x: torch.Tensor) -> torch.Tensor:
    """C's round(): halves away from zero (torch.round rounds halves to even)."""
    t = torch.trunc(x)
    return t + torch.where((x - t).abs() >= 0.5, torch.sign(x), torch.zeros_like(x))


def check_roi_bottoms(layer: CaffeLayer, bottom_shapes: Sequence[Shape]) -> None:
    """bottom[0] is N x C x H x W; bottom[1] holds R rows of [batch_index x1 y1 x2 y2]."""
    data, rois = bottom_shapes[0], bottom_shapes[1]
    if len(data) != 4:
        raise layer.error("bottom[0] must be a 4-D feature map", expected="N x C x H x W", got=data)
    per_roi = 1
    for d in rois[1:]:
        per_roi *= d
    if not 2 <= len(rois) <= 4 or per_roi != 5:
        raise layer.error(
            "bottom[1] must hold one [batch_index x1 y1 x2 y2] row per ROI",
            expected="R x 5 (or R x 5 x 1 x 1)",
            got=rois,
        )


def roi_batch_index(layer: CaffeLayer, rois: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Column 0 of R x 5 rois as item indices (C's int cast truncates), checked in [0, N)."""
    batch = rois[:, 0].long()
    if batch.numel() and batch.device.type != "meta":
        bad = (batch < 0) | (batch >= batch_size)
        if bool(bad.any()):
            raise layer.error(
                "roi batch index out of range",
                expected=f"0 <= index < N ({batch_size})",
                got=rois[bad, 0].tolist()[:5],
            )
    return batch


def bin_windows(
    start: torch.Tensor, end: torch.Tensor, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Index windows for bins ``[start, end)`` (already clipped to ``[0, size]``).

    Returns ``(index, valid)`` of shape ``start.shape + (K,)`` where K is the widest bin;
    ``index`` is clamped into the axis so invalid slots can be gathered and then masked.
    """
    widths = (end - start).clamp_min(0)
    k = max(int(widths.max()) if widths.numel() else 0, 1)
    offsets = torch.arange(k, device=start.device)
    index = start.unsqueeze(-1) + offsets
    valid = index < end.unsqueeze(-1)
    return index.clamp(0, max(size - 1, 0)), valid


def roi_chunks(num_rois: int, per_roi: int) -> list[slice]:
    """Slices over ROIs so that each chunk gathers at most about CHUNK_ELEMENTS values."""
    step = max(1, CHUNK_ELEMENTS // max(per_roi, 1))
    return [slice(i, min(i + step, num_rois)) for i in range(0, num_rois, step)]
