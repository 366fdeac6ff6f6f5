"""A convolution's geometry as functions of ``ConvGeometry.spec`` alone, and C's division.

A traced fold reads its producer's spec from its settings tuple (``net/passes/folding.py``):
reached through the layer's ``geom``, the spec costs a compiled call three guard nodes a
convolution. ``ConvGeometry``'s methods are these functions over its own spec. A module of
its own: ``opaque_conv``, which ``ops.base`` imports, needs them without ``_conv_geometry``
(which imports ``ops.base``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def c_div(a: int, b: int) -> int:
    """C integer division (truncates toward zero), as Caffe's output-size formulas use.

    A size under ``torch.compile(dynamic=True)`` or ``torch.export`` is symbolic. Its sign
    is then a guard, and the quotient a plain floor division, which the sizes after it and
    inductor's indexing can simplify. A division that stays symbolic in the sign (``Max(a, 0)
    // b - Max(-a, 0) // b``) nested one more ``Max`` a convolution, through the shapes that
    the opaque convolution op reports: compiling ResNet-50 with a dynamic channels_last input
    took over 15 minutes. Only a data-dependent size, whose sign cannot be guarded, keeps that
    form. Dynamo shows a symbolic size as an int: ``a >= 0`` is the guard there. Under jit
    tracing (the legacy ONNX exporter) sizes arrive as 0-d tensors and are read as ints."""
    if isinstance(a, torch.Tensor):
        a = int(a)
    if b < 0:
        return -c_div(a, -b)
    if isinstance(a, torch.SymInt) and not _sign_known(a):
        return torch.sym_max(a, 0) // b - torch.sym_max(-a, 0) // b
    return a // b if a >= 0 else -(-a // b)


def _sign_known(a: torch.SymInt) -> bool:
    """Whether ``a >= 0`` can be decided, with a guard where needed (``guard_or_false``:
    torch >= 2.7; before it every symbolic size keeps the form without a guard). Imported
    here: building a net must not load sympy (``test_arithmetic_output_shapes``)."""
    from torch.fx.experimental import symbolic_shapes

    guard = getattr(symbolic_shapes, "guard_or_false", None)
    return guard is not None and (guard(a >= 0) or guard(a < 0))


Spec = tuple[Any, ...]  # (channel_axis, kernel, stride, pad, dilation, extent)


def spec_layout(spec: Spec) -> tuple[int, int]:
    """(channel axis, number of spatial axes)."""
    return spec[0], len(spec[1])


def spec_is_pointwise(spec: Spec) -> bool:
    """See ``ConvGeometry.is_pointwise``."""
    _, kernel, stride, pad, _, _ = spec
    return all(k == 1 for k in kernel) and all(s == 1 for s in stride) and not any(pad)


def spec_conv_output(spec: Spec, spatial: Sequence[int]) -> tuple[int, ...]:
    """See ``ConvGeometry.conv_output``."""
    _, _, stride, pad, _, extent = spec
    return tuple(c_div(i + 2 * p - e, s) + 1 for i, p, e, s in zip(spatial, pad, extent, stride))


def spec_extra_pad(spec: Spec, spatial: Sequence[int]) -> tuple[int, ...]:
    """See ``ConvGeometry.extra_pad``. Runs on every forward, so the usual case (no short
    axis) returns before computing output sizes."""
    _, kernel, stride, pad, _, extent = spec
    if all(i + 2 * p >= e for i, p, e in zip(spatial, pad, extent)):
        return (0,) * len(kernel)
    out = spec_conv_output(spec, spatial)
    return tuple(
        max(0, (o - 1) * s + e - (i + 2 * p))
        for o, s, e, i, p in zip(out, stride, extent, spatial, pad)
    )
