"""``TorchNet.layers``: a ModuleDict that counts the changes of its entries.

A net caches what it derives from its layers: the passes' programs (which call the layer
objects they were made from) and where each param blob lives. A PyTorch user swaps a
module in place (``net.layers["fc8"] = nn.Linear(4096, 10)``, a new head to fine-tune) and
expects the next forward to run it, as any torch model would; a cached program would go on
calling the old one. Every way torch offers to put a module in or take one out of the dict
(item and attribute assignment, ``update``, ``pop``, ``clear``, deletion) goes through the
methods below, which bump ``_changes``; the net compares it with the count its caches were
made at (``TorchNet._cached_program``). Replacing ``net.layers`` itself is not followed.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..ops import hook_watch


class LayerDict(nn.ModuleDict):
    """A ModuleDict whose ``_changes`` counts the entries put in or taken out since built."""

    _changes = 0  # (a class default: a layer of that name would need the key anyway)

    def _changed(self) -> None:
        object.__setattr__(self, "_changes", self._changes + 1)
        hook_watch.hooks_changed()  # the module put in may carry hooks: nets look again

    def add_module(self, name: str, module: nn.Module | None) -> None:
        """``layers[key] = m``, ``update``, ``register_module`` come here."""
        super().add_module(name, module)
        self._changed()

    def __setattr__(self, name: str, value: Any) -> None:
        """``layers.conv1 = m`` (nn.Module's own assignment, which skips ``add_module``)."""
        super().__setattr__(name, value)
        if isinstance(value, nn.Module):
            self._changed()

    def __delitem__(self, key: str) -> None:
        """``del layers[key]`` and ``pop``."""
        super().__delitem__(key)
        self._changed()

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        self._changed()

    def clear(self) -> None:
        super().clear()
        self._changed()
