"""A value derived from some tensors, kept until one of them changes.

Folded weights and a BatchNorm's scaled statistics are recomputed only when a source changes,
as its version counter (every in-place torch op bumps it), storage, dtype or device shows. A
write that bypasses the counter (through ``.data``, ``.numpy()`` or ``.detach()``) must be
followed by ``forget``: ``TorchNet.params_changed`` does it for the net's caches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch

T = TypeVar("T")


class DerivedCache(Generic[T]):
    """``get(sources, compute)`` returns ``compute()``'s value, computed again only when a
    source changed since the last call. It is computed outside inference mode and without
    autograd, so the value can be read by a later run that autograd records."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._value: T | None = None

    def get(self, sources: Sequence[torch.Tensor], compute: Callable[[], T]) -> T:
        key = tuple((t._version, t.data_ptr(), t.dtype, t.device) for t in sources)
        if key != self._key or self._value is None:
            with torch.inference_mode(False), torch.no_grad():
                self._value = compute()
            self._key = key
        return self._value

    def forget(self) -> None:
        """Drop the value: a source was written where its version does not show it."""
        self._key, self._value = None, None
