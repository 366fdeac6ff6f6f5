"""Telling nets that one of their layers changed its train/eval mode on its own.

The passes decide some merges by the layers' modes (a BatchNorm that uses its global
statistics folds into its Convolution), so a net keys its programs on the layers whose mode
is not its own (``TorchNet.layers_off_mode``). ``bn.train()`` alone, after a run, must
change that key, in eager mode and under torch.compile alike. A net keeps the list as an
attribute that it rebuilds when told (dynamo guards the attribute's value, so a compiled net
traces again after a switch), rather than reading every layer's mode per call (in a compiled
forward that adds a Python-evaluated guard per layer).

A net setting its own mode (``net.train()``) switches every layer: it quiets the
notifications and reads its layers once, after.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Protocol


class ModeWatcher(Protocol):
    def layer_modes_changed(self) -> None: ...


_WATCHERS: weakref.WeakSet[ModeWatcher] = weakref.WeakSet()  # type: ignore[type-var]
_QUIET = [0]


def watch(watcher: ModeWatcher) -> None:
    """Call ``watcher.layer_modes_changed()`` after any layer switches mode on its own."""
    _WATCHERS.add(watcher)


def layer_switched() -> None:
    """A layer's mode changed (``CaffeLayer.train``)."""
    if _QUIET[0]:
        return
    for watcher in list(_WATCHERS):
        watcher.layer_modes_changed()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No notifications inside (a net switching all its layers, which reads them after)."""
    _QUIET[0] += 1
    try:
        yield
    finally:
        _QUIET[0] -= 1
