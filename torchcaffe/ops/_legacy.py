"""Caffe's legacy 4-D blob accessors (num, channels, height, width) for fork-era layers."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import CaffeLayer


def legacy_nchw(
    layer: CaffeLayer, shape: Sequence[int], *, min_axes: int = 1
) -> tuple[int, int, int, int]:
    """Blob::LegacyShape for axes 0..3: 1 past the last axis; Caffe aborts above 4 axes."""
    if not min_axes <= len(shape) <= 4:
        raise layer.error(
            f"bottom must have {min_axes} to 4 axes (Caffe reads it through the "
            "legacy num/channels/height/width accessors)",
            expected=f"{min_axes} <= num_axes <= 4",
            got=list(shape),
        )
    # a symbolic size (a dynamic batch under torch.export) stays symbolic: int() would
    # specialize it, and the ONNX export would fix the batch it was traced at
    dims = [d if isinstance(d, torch.SymInt) else int(d) for d in shape] + [1] * (4 - len(shape))
    return dims[0], dims[1], dims[2], dims[3]
