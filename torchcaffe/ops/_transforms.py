"""Whether a torch.func transform (vmap, grad, jvp, jacrev, functional_call under them) runs
the current call.

Its wrapped tensors refuse what the CPU's fast forms rely on: a memory-format query, a branch
on a value (``bool()``, ``item()``), an ``out=`` op, oneDNN's opaque ops and weight caches
built outside the transform. Under a transform a layer takes its plain form of torch ops,
which every transform batches and differentiates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch
from torch.autograd import forward_ad

from ..errors import TorchCaffeError, UnsupportedError

if TYPE_CHECKING:
    from .base import CaffeLayer

F = TypeVar("F", bound=type[torch.autograd.Function])


# Is a torch.func transform active? torch's own C function, called as it is: 23 ns a call,
# where a Python wrapper took 72 (the CPU's layout checks call it for every convolution).
under_func_transform: Callable[[], bool] = torch._C._are_functorch_transforms_active


def under_vmap() -> bool:
    """Is a vmap among the active torch.func transforms? A torch without the interpreter
    stack this reads counts as one (the caller then refuses what vmap cannot run)."""
    try:
        from torch._C._functorch import TransformType
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    except ImportError:
        return True
    return any(i.key() == TransformType.Vmap for i in retrieve_all_functorch_interpreters())


def refuse_stats_update(layer: CaffeLayer) -> None:
    """Raise for a layer about to update its moving averages in place (a BatchNorm on batch
    statistics) under vmap, which torch refuses naming no layer: each sample would be
    normalized by its own statistics and write them. Under grad or jvp alone the update goes
    to the buffers the transform was given, as torch's BatchNorm's does
    (``stats_update_refused`` names the layer where the transform captured them)."""
    if under_func_transform() and under_vmap():
        raise layer.error(
            "cannot run on batch statistics under torch.func's vmap: it updates its "
            "moving averages in place",
            cls=UnsupportedError,
            expected="the statistics it stores (use_global_stats: true, or the TEST phase)",
            got="batch statistics",
        )


def stats_update_refused(layer: CaffeLayer) -> TorchCaffeError:
    """The error for torch's refusal to update ``layer``'s moving averages under grad or
    jvp (raise it from torch's): the transform captured the buffers instead of being given
    them."""
    return layer.error(
        "cannot update its moving averages from batch statistics under a torch.func "
        "transform that captured them",
        cls=UnsupportedError,
        expected="the net's buffers given to the transformed function",
        got="buffers the transform captured",
        hint="functional_call(net, (params, dict(net.named_buffers())), ...) inside the "
        "transformed function, with the buffers as its argument",
    )


def forward_mode_possible() -> bool:
    """Can forward-mode AD reach this call: a torch.func transform (``jvp``, ``jacfwd``) or
    a ``torch.autograd.forward_ad`` dual level?"""
    return under_func_transform() or forward_ad._current_level >= 0


_WITH_JVP: dict[type, type] = {}


def with_jvp(cls: F) -> F:
    """The autograd.Function ``cls``, or, where forward mode may run, its subclass whose
    ``jvp`` is ``cls.tangent``. Dynamo cannot trace a Function that defines ``jvp`` (torch
    2.13: a graph break at each, in every compiled training forward), so the classes keep
    their forward-mode rule under another name and get a ``jvp`` only where it is wanted."""
    if not forward_mode_possible():
        return cls
    made = _WITH_JVP.get(cls)
    if made is None:
        namespace = {"jvp": staticmethod(cls.tangent), "__module__": cls.__module__}  # type: ignore[attr-defined]
        made = _WITH_JVP[cls] = type(f"{cls.__name__}WithJvp", (cls,), namespace)
    return made  # type: ignore[return-value]
