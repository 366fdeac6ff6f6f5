"""Whether torch module hooks watch a net's layers.

The passes merge layers into steps that do not call them as modules (a fold computes a
Convolution, its BatchNorm, Scale and ReLU in one call), so a hook on a merged layer would
never run. A user who registers a forward hook on ``net.layers['conv1']`` to read features
expects it to run on every forward, as in any torch model: a net whose layers carry hooks
(or under global module hooks) runs its layers as they are instead (``TorchNet``). So does a
net where a layer's instance was given a ``forward`` of its own (``layer.forward = wrapped``,
a common way to probe a torch model): a fold would skip it, and an eager walk would call the
one the layer had when the program was made.

Scanning every layer's hook dicts on each call costs ~30 us for ResNet-50's 245 layers, so a
net scans again only when a layer's ``register_*_hook`` ran since (``EPOCH``) or its last
scan found hooks (a removed handle shows then); CaffeLayer's ``__setattr__`` bumps it for a
``forward`` too, and ``net.layers`` for a module put in. Hooks written into a layer's private
dicts directly, or a ``forward`` replaced on a layer's class, are seen only at the next scan,
or not at all. A module that is not a CaffeLayer (one a user put in ``net.layers``) needs no
scan for hooks registered on it later: no pass merges it, and a run calls it as a module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn
from torch.nn.modules import module as torch_module

# bumped by CaffeLayer's register_*_hook methods
EPOCH = [0]
# nn.Module's hook registrations that CaffeLayer wraps with ``noting_changes``
REGISTER_METHODS = (
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_full_backward_pre_hook",
    "register_backward_hook",
)

_MODULE_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)
_GLOBAL_HOOKS = tuple(
    getattr(torch_module, name, {})
    for name in (
        "_global_forward_hooks",
        "_global_forward_pre_hooks",
        "_global_backward_hooks",
        "_global_backward_pre_hooks",
    )
)


def hooks_changed() -> None:
    """A layer's hooks were registered: nets scan again."""
    EPOCH[0] += 1


def noting_changes(register: Callable[..., Any]) -> Callable[..., Any]:
    """``register`` (an nn.Module method), then ``hooks_changed``."""

    @functools.wraps(register)
    def registered(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        handle = register(module, *args, **kwargs)
        hooks_changed()
        return handle

    return registered


def global_hooks() -> bool:
    """Are module hooks registered for every module (``register_module_forward_hook``)?"""
    return any(_GLOBAL_HOOKS)


def any_hooked(modules: Iterable[nn.Module]) -> bool:
    """Does any of ``modules`` carry a forward or backward hook of its own, or a ``forward``
    of its own that it was not built with (``replaced_forward``)?"""
    return any(
        replaced_forward(m) or any(getattr(m, name) for name in _MODULE_HOOKS) for m in modules
    )


def replaced_forward(module: nn.Module) -> bool:
    """Has ``module``'s instance been given a ``forward`` other than the one it was built
    with (``built_forward``: a layer that picks its forward per instance when built)? A bound
    method compares equal to its copy bound to the same instance (a deep-copied net's)."""
    own = vars(module).get("forward")
    return own is not None and own != getattr(module, "built_forward", None)
