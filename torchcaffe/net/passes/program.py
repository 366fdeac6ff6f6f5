"""The program the passes transform: steps plus one runner per step key."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..program import LayerStep

Runner = Callable[..., Any]


@dataclass(frozen=True)
class OptimizedProgram:
    """Steps to run and the callable for each step key (modules, or a pass's derived runner).

    ``report`` maps a pass name to how many steps it rewrote (tests read it to see a pass fired).
    """

    steps: tuple[LayerStep, ...]
    runners: Mapping[str, Runner]
    report: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def unoptimized(
        cls, steps: list[LayerStep], modules: Mapping[str, nn.Module] | nn.ModuleDict
    ) -> OptimizedProgram:
        return cls(tuple(steps), {s.key: modules[s.key] for s in steps}, {})

    def rewritten(
        self, name: str, steps: list[LayerStep], new_runners: Mapping[str, Runner], count: int
    ) -> OptimizedProgram:
        runners = {s.key: new_runners.get(s.key) or self.runners[s.key] for s in steps}
        return OptimizedProgram(tuple(steps), runners, {**self.report, name: count})


def readers_of(steps: tuple[LayerStep, ...], index: int, blob: str) -> list[int]:
    """Steps that read the value step ``index`` wrote to ``blob`` (until ``blob`` is rewritten;
    an in-place writer reads it first, so it counts)."""
    out = []
    for j in range(index + 1, len(steps)):
        if blob in steps[j].bottoms:
            out.append(j)
        if blob in steps[j].tops:
            break
    return out


def producer_of(steps: tuple[LayerStep, ...], index: int, blob: str) -> int | None:
    """The step whose write of ``blob`` step ``index`` reads (None: an input)."""
    for j in range(index - 1, -1, -1):
        if blob in steps[j].tops:
            return j
    return None
