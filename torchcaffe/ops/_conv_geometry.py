"""Convolution geometry shared by Convolution, Deconvolution, Im2col and the depthwise forks.

``conv_geometry`` parses a ConvolutionParameter as Caffe's BaseConvolutionLayer::LayerSetUp
does: ``kernel_size``/``stride``/``pad``/``dilation`` given once or once per spatial axis, or
the 2-D-only ``kernel_h``/``kernel_w`` style. ``im2col_nd``/``col2im_nd`` are Caffe's
channel-major column layout for any number of spatial axes, as index gathers that autograd
differentiates; layers use torch's fused ops where they exist and these only beyond them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F

from ._conv_spec import (  # noqa: F401  (c_div: imported from here too)
    c_div,
    spec_conv_output,
    spec_extra_pad,
    spec_is_pointwise,
    spec_layout,
)
from .base import CaffeLayer, canonical_axis


@dataclass(frozen=True, slots=True)
class ConvGeometry:
    """A convolution's or pooling's per-axis geometry. Slots: torch.compile reads it in every
    traced forward, and a method called on an instance with a ``__dict__`` is one more guard
    (that the dict does not shadow it) checked on every compiled call.

    What a forward needs is read from ``spec``, one tuple of all the fields, through methods:
    dynamo guards each attribute a traced forward reads, and checks those guards on every
    compiled call, so one tuple is one guard node with 3 checks where the fields read one by
    one were 6 nodes with 16 (MobileNetV2: 6,562 -> 5,594 guard lines; its guard check at
    batch 1, three alternated processes each, 0.51-0.58 -> 0.45-0.54 ms). The fields stay
    for everyone else."""

    channel_axis: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    pad: tuple[int, ...]
    dilation: tuple[int, ...]
    extent: tuple[int, ...] = field(init=False, compare=False)  # dilated: d * (k - 1) + 1
    # (channel_axis, kernel, stride, pad, dilation, extent)
    spec: tuple[Any, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        extent = tuple(d * (k - 1) + 1 for k, d in zip(self.kernel, self.dilation))
        object.__setattr__(self, "extent", extent)
        spec = (self.channel_axis, self.kernel, self.stride, self.pad, self.dilation, extent)
        object.__setattr__(self, "spec", spec)

    def __getstate__(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """From a dict of fields, as pickled before ConvGeometry had slots (no ``extent``)."""
        for name in ("channel_axis", "kernel", "stride", "pad", "dilation"):
            object.__setattr__(self, name, state[name])
        self.__post_init__()

    @property
    def num_spatial(self) -> int:
        return len(self.spec[1])

    def layout(self) -> tuple[int, int]:
        """(channel axis, number of spatial axes)."""
        return spec_layout(self.spec)

    def torch_args(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(stride, pad, dilation), as torch's convolutions take them."""
        return self.spec[2], self.spec[3], self.spec[4]

    @property  # not cached_property: Python 3.11's takes a lock, which dynamo cannot trace
    def is_pointwise(self) -> bool:
        """A 1-wide kernel on every axis, stride 1, no pad: each output reads one input
        position (dense, it is one GEMM over the positions)."""
        return spec_is_pointwise(self.spec)

    def conv_output(self, spatial: Sequence[int]) -> tuple[int, ...]:
        """Caffe: (in + 2 * pad - extent) / stride + 1, with C's truncating division."""
        return spec_conv_output(self.spec, spatial)

    def deconv_output(self, spatial: Sequence[int]) -> tuple[int, ...]:
        """Caffe: stride * (in - 1) + extent - 2 * pad."""
        _, _, stride, pad, _, extent = self.spec
        return tuple(s * (i - 1) + e - 2 * p for i, p, e, s in zip(spatial, pad, extent, stride))

    def extra_pad(self, spatial: Sequence[int]) -> tuple[int, ...]:
        """Zeros to add after each axis so that floor rounding gives Caffe's output size
        (non-zero only where in + 2 * pad < extent, which C's division rounds up to one output)."""
        return spec_extra_pad(self.spec, spatial)


def _per_axis(
    layer: CaffeLayer, values: Sequence[int], field: str, n: int, default: int | None
) -> tuple[int, ...]:
    allowed = {1, n} if default is None else {0, 1, n}
    if len(values) not in allowed:
        raise layer.error(
            f"{field} must be specified once, or once per spatial dimension",
            expected=" or ".join(str(a) for a in sorted(allowed)) + " values",
            got=f"{len(values)} values for {n} spatial dims",
        )
    if not values:  # with no default, only n == 0 gets here
        return () if default is None else (default,) * n
    return tuple(int(values[0 if len(values) == 1 else i]) for i in range(n))


def _hw_or_repeated(
    layer: CaffeLayer, p, name: str, n: int, default: int | None
) -> tuple[int, ...]:
    """``<name>_h``/``<name>_w`` (2-D only, not with ``<name>``), else the repeated field."""
    repeated = "kernel_size" if name == "kernel" else name
    h, w = f"{name}_h", f"{name}_w"
    if p.HasField(h) or p.HasField(w):
        if n != 2:
            raise layer.error(
                f"{h} & {w} can only be used for 2D convolution", expected="2 spatial dims", got=n
            )
        if len(getattr(p, repeated)):
            raise layer.error(
                f"either {repeated} or {h}/{w} should be specified; not both",
                expected=f"{repeated} or {h}/{w}",
                got="both",
            )
        return (int(getattr(p, h)), int(getattr(p, w)))
    return _per_axis(layer, list(getattr(p, repeated)), repeated, n, default)


def conv_geometry(
    layer: CaffeLayer, p, bottom_shape: Sequence[int], *, min_spatial: int = 0
) -> ConvGeometry:
    """Parse ``p`` (a ConvolutionParameter) for a bottom of ``bottom_shape``, with Caffe's
    checks as located LayerParamErrors."""
    axis = canonical_axis(layer, p.axis, len(bottom_shape))
    n = len(bottom_shape) - axis - 1
    if n < min_spatial:
        raise layer.error(
            "too few spatial axes after the channel axis", expected=f">= {min_spatial}", got=n
        )
    kernel = _hw_or_repeated(layer, p, "kernel", n, None)
    if any(k <= 0 for k in kernel):
        raise layer.error("filter dimensions must be nonzero", expected="kernel > 0", got=kernel)
    stride = _hw_or_repeated(layer, p, "stride", n, 1)
    if any(s <= 0 for s in stride):
        raise layer.error("stride dimensions must be nonzero", expected="stride > 0", got=stride)
    pad = _hw_or_repeated(layer, p, "pad", n, 0)
    dilation = _per_axis(layer, list(p.dilation), "dilation", n, 1)
    if any(d <= 0 for d in dilation):
        raise layer.error("dilation must be positive", expected="dilation > 0", got=dilation)
    return ConvGeometry(axis, kernel, stride, pad, dilation)


def window_index(
    geom: ConvGeometry, padded: Sequence[int], out: Sequence[int], device: torch.device
) -> torch.Tensor:
    """(prod(kernel), prod(out)) flat indices into a padded spatial block: kernel offsets in
    row-major order (Caffe's column rows), output positions in row-major order."""
    idx = torch.zeros((1,) * (2 * len(out)), dtype=torch.long, device=device)
    n = len(out)
    for a in range(n):
        step = math.prod(padded[a + 1 :])
        koff = torch.arange(geom.kernel[a], device=device) * geom.dilation[a]
        opos = torch.arange(out[a], device=device) * geom.stride[a]
        kshape = [1] * (2 * n)
        kshape[a] = -1
        oshape = [1] * (2 * n)
        oshape[n + a] = -1
        idx = idx + (koff.view(kshape) + opos.view(oshape)) * step
    return idx.reshape(math.prod(geom.kernel), math.prod(out))


def _pad_spatial(x: torch.Tensor, before: Sequence[int], after: Sequence[int]) -> torch.Tensor:
    pads: list[int] = []
    for b, a in zip(reversed(before), reversed(after)):
        pads += [b, a]
    return F.pad(x, pads) if any(pads) else x


def im2col_nd(x: torch.Tensor, geom: ConvGeometry) -> torch.Tensor:
    """(N, C, *spatial) -> (N, C * prod(kernel), *out), Caffe's im2col_nd layout."""
    spatial = tuple(x.shape[2:])
    out = geom.conv_output(spatial)
    xp = _pad_spatial(x, geom.pad, [p + e for p, e in zip(geom.pad, geom.extra_pad(spatial))])
    padded = tuple(xp.shape[2:])
    idx = window_index(geom, padded, out, x.device)
    cols = xp.reshape(*x.shape[:2], -1)[:, :, idx.reshape(-1)]
    return cols.reshape(x.shape[0], -1, *out)


def col2im_nd(cols: torch.Tensor, geom: ConvGeometry, spatial: Sequence[int]) -> torch.Tensor:
    """Adjoint of ``im2col_nd``: (N, C * prod(kernel), *out) summed back into (N, C, *spatial)."""
    out = geom.conv_output(spatial)
    extra = geom.extra_pad(spatial)
    padded = tuple(i + 2 * p + e for i, p, e in zip(spatial, geom.pad, extra))
    idx = window_index(geom, padded, out, cols.device).reshape(-1)
    n, k = cols.shape[0], math.prod(geom.kernel)
    flat = cols.reshape(n, -1, k * math.prod(out))
    acc = flat.new_zeros(n, flat.shape[1], math.prod(padded)).index_add(2, idx, flat)
    acc = acc.reshape(n, -1, *padded)
    crop = tuple(slice(p, p + i) for p, i in zip(geom.pad, spatial))
    return acc[(slice(None), slice(None)) + crop]
