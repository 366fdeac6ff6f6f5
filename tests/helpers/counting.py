"""Counting the calls of a function a test swaps in (to see which path a forward took)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def counting(
    real: Callable[..., Any], count: list[int], only: Callable[..., bool] | None = None
) -> Callable[..., Any]:
    """``real``, adding one to ``count[0]`` at each call (each that ``only`` accepts)."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        if only is None or only(*args):
            count[0] += 1
        return real(*args, **kwargs)

    return counted


def count_calls(
    monkeypatch: Any, owner: Any, name: str, only: Callable[..., bool] | None = None
) -> list[int]:
    """Replace ``owner.name`` by a counting wrapper for the test; the count, as a 1-list."""
    count = [0]
    monkeypatch.setattr(owner, name, counting(getattr(owner, name), count, only))
    return count
