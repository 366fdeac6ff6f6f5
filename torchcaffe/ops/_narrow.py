"""16-bit nets (``.half()``, ``.bfloat16()``): where a layer computes in float32.

Caffe's blobs are float32. A torch-face net converted to float16 or bfloat16 runs most layers
in that dtype, but some arithmetic leaves its range there: a float16 sum past 65504 or square
past 256 is inf, eps and FLT_MIN-style constants round to 0, and bfloat16 rounds integers past
256 and stops adding small terms to large sums. Such layers compute a 16-bit input in float32
and round their tops once (``computed_in_float32``); float32 and float64 take the layer's own
code unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

NARROW_FLOATS = (torch.float16, torch.bfloat16)

F = TypeVar("F", bound=Callable[..., Any])


def is_narrow(dtype: torch.dtype) -> bool:
    """Is ``dtype`` a 16-bit float, which the layers above widen?"""
    return dtype in NARROW_FLOATS


def computed_in_float32(forward: F) -> F:
    """A layer's ``forward`` that takes its 16-bit tensor arguments in float32 and rounds its
    tensor outputs (one, or a tuple) back to the first argument's dtype once."""

    @functools.wraps(forward)
    def wrapper(self: Any, *args: Any) -> Any:
        first = args[0]
        if not (isinstance(first, torch.Tensor) and is_narrow(first.dtype)):
            return forward(self, *args)
        wide = [
            a.float() if isinstance(a, torch.Tensor) and is_narrow(a.dtype) else a for a in args
        ]
        out = forward(self, *wide)
        if isinstance(out, tuple):
            return tuple(t.to(first.dtype) for t in out)
        return out.to(first.dtype)

    return wrapper  # type: ignore[return-value]
