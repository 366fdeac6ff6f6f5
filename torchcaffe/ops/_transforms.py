"""Whether a torch.func transform (vmap, grad, jvp, jacrev, functional_call under them) runs
the current call.

Its wrapped tensors refuse what the CPU's fast forms rely on: a memory-format query, a branch
on a value (``bool()``, ``item()``), an ``out=`` op, oneDNN's opaque ops and weight caches
built outside the transform. Under a transform a layer takes its plain form of torch ops,
which every transform batches and differentiates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ..errors import UnsupportedError

if TYPE_CHECKING:
    from .base import CaffeLayer


# Is a torch.func transform active? torch's own C function, called as it is: 23 ns a call,
# where a Python wrapper took 72 (the CPU's layout checks call it for every convolution).
under_func_transform: Callable[[], bool] = torch._C._are_functorch_transforms_active


def refuse_stats_update(layer: CaffeLayer) -> None:
    """Raise for a layer about to update its moving averages in place (a BatchNorm on batch
    statistics) under a transform: the update would write values the transform batches or
    differentiates into buffers the net keeps once, which torch refuses naming no layer."""
    if under_func_transform():
        raise layer.error(
            "cannot run on batch statistics under a torch.func transform: it updates its "
            "moving averages in place",
            cls=UnsupportedError,
            expected="the statistics it stores (use_global_stats: true, or the TEST phase)",
            got="batch statistics",
        )
