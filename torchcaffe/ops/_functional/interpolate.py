"""Separable two-tap resampling of the last two axes, with each fork's own source coordinates.

Every bilinear layer here (PSPNet/DeepLab ``Interp``, brocolli ``BilinearInterpolate`` and
``Resize``) computes, per output pixel, ``h0w * (w0w * a + w1w * b) + h1w * (w0w * c + w1w * d)``
from four neighbours. The forks differ only in where an output row/column lands in the input
(its two neighbour indices and weights) and in which neighbours they drop at the border; the
``*_taps`` functions below state each fork's coordinate arithmetic, in the fork's own float
precision. Resampling gathers neighbours (``index_select``), so only the four neighbours of an
output pixel ever touch it (NaN/inf stay as local as in the loops), and autograd's adjoint is
exactly the forks' scatter-add backward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Taps(NamedTuple):
    """One axis: output j reads ``w0[j] * x[i0[j]] + w1[j] * x[i1[j]]``; ``valid1`` False drops
    the second neighbour (brocolli Resize at the last row/column)."""

    i0: torch.Tensor
    i1: torch.Tensor
    w0: torch.Tensor
    w1: torch.Tensor
    valid1: torch.Tensor | None = None


def _coord_dtype(dtype: torch.dtype) -> torch.dtype:
    """Caffe builds only float and double: anything but double computes as float."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _f32_ratio(num: int, den: int) -> torch.Tensor:
    """``static_cast<float>(num) / den``: one correctly rounded float division."""
    return torch.tensor(num, dtype=torch.float32) / torch.tensor(den, dtype=torch.float32)


def interp2_taps(n_in: int, n_out: int, dtype: torch.dtype, device) -> Taps:
    """PSPNet/DeepLab ``caffe_cpu_interp2``: x = j * (n_in - 1) / (n_out - 1) in float
    (0 when n_out == 1), i0 = trunc(x), i1 = i0 + 1 except on the last input row (then i0);
    lambda1 = x - i0 in float, lambda0 = 1 - lambda1 in Dtype."""
    ratio = _f32_ratio(n_in - 1, n_out - 1) if n_out > 1 else torch.tensor(0.0)
    x = torch.arange(n_out, dtype=torch.float32) * ratio
    i0 = x.to(torch.int64)  # C++ float -> int conversion truncates (x >= 0 here)
    i1 = torch.where(i0 < n_in - 1, i0 + 1, i0)
    w1 = (x - i0.to(torch.float32)).to(_coord_dtype(dtype))
    w0 = 1 - w1
    return _to(Taps(i0, i1, w0, w1), dtype, device)


def bilinear_interpolate_taps(
    n_in: int, n_out: int, align_corners: bool, dtype: torch.dtype, device
) -> Taps:
    """brocolli ``BilinearInterpolate``: x = (j + 0.5) * in / out - 0.5 (double maths, stored
    as Dtype) or, with align_corners, j * float((in - 1) / (out - 1)) in Dtype; x clamped to
    [0, in - 1]; i0 = floor(x) clamped to [0, in - 2], i1 = i0 + 1; weights i1 - x, x - i0.

    With in == 1 the fork's i0 is -1 with weight exactly 0 (an out-of-bounds read it
    multiplies by 0); that neighbour is read at index 0 instead.
    """
    cdt = _coord_dtype(dtype)
    j = torch.arange(n_out, dtype=cdt)
    if align_corners:
        x = j * _f32_ratio(n_in - 1, n_out - 1).to(cdt)
    else:
        x = (_f32_ratio(n_in, n_out).double() * (j.double() + 0.5) - 0.5).to(cdt)
    x = x.clamp(max=n_in - 1).clamp(min=0)
    i0 = torch.floor(x).to(torch.int64).clamp(min=0).clamp(max=n_in - 2)
    i1 = i0 + 1
    w0 = i1.to(cdt) - x
    w1 = x - i0.to(cdt)
    return _to(Taps(i0.clamp(min=0), i1, w0, w1), dtype, device)


def resize_taps(n_in: int, n_out: int, dtype: torch.dtype, device) -> Taps:
    """brocolli ``Resize`` (util_img ``BiLinearResizeMat_cpu``): x = j * (in / out) in Dtype,
    i0 = floor(x), weights |1 - frac|, |frac|; the i0 + 1 neighbour is dropped past the last
    input row/column, without renormalising the weights."""
    cdt = _coord_dtype(dtype)
    scale = torch.tensor(n_in, dtype=cdt) / torch.tensor(n_out, dtype=cdt)
    x = torch.arange(n_out, dtype=cdt) * scale
    i0 = torch.floor(x).to(torch.int64).clamp(max=n_in - 1)
    frac = x - i0.to(cdt)
    valid1 = i0 + 1 < n_in
    taps = Taps(i0, torch.where(valid1, i0 + 1, i0), (1 - frac).abs(), frac.abs(), valid1)
    return _to(taps, dtype, device)


def _to(taps: Taps, dtype: torch.dtype, device) -> Taps:
    def move(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)

    return Taps(
        move(taps.i0),
        move(taps.i1),
        move(taps.w0),
        move(taps.w1),
        None if taps.valid1 is None else move(taps.valid1),
    )


def _one_axis(x: torch.Tensor, taps: Taps, dim: int) -> torch.Tensor:
    shape = [-1] + [1] * (-1 - dim)  # weights broadcast along ``dim``
    w0, w1 = taps.w0.view(shape), taps.w1.view(shape)
    second = w1 * x.index_select(dim, taps.i1)
    if taps.valid1 is not None:
        second = torch.where(
            taps.valid1.view(shape), second, torch.zeros((), dtype=x.dtype, device=x.device)
        )
    return w0 * x.index_select(dim, taps.i0) + second


def resample2d(x: torch.Tensor, taps_h: Taps, taps_w: Taps) -> torch.Tensor:
    """(..., H_in, W_in) -> (..., H_out, W_out): along W first, then along H, which is the
    forks' expression ``h0w * (w0w * a + w1w * b) + h1w * (w0w * c + w1w * d)``."""
    return _one_axis(_one_axis(x, taps_w, -1), taps_h, -2)
