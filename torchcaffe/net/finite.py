"""Whether the params a program reads as they are (not through a fold) are all finite, kept
until one of them changes.

A run whose inputs and params are finite may run its plain ReLUs in oneDNN's epilogue
(``ops.fused_relu``). A fold checks the weights it derives itself (``FoldedAffine``), so only
the layers a program runs unfolded are checked here; reading their blobs on each forward would
read the model, so the answer is kept on the blobs' versions and storage, as folded weights
are (``ops._derived``), and ``TorchNet.params_changed`` drops it after a write that bumps no
version.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops import data_watch
from ..ops._derived import Key
from ..ops.base import blob_slots, read_slots
from .passes import FoldedAffine, OptimizedProgram


def unfolded_layers(program: OptimizedProgram) -> list[Any]:
    """The layers with param blobs whose steps ``program`` runs as they are."""
    return [
        runner
        for runner in program.inner_runners()
        if not isinstance(runner, FoldedAffine) and getattr(runner, "blob_names", None)
    ]


class FiniteParams:
    """``check(program)``: are the param blobs of ``program``'s unfolded layers finite? Kept
    per program (a net runs one per set of blobs it is asked for)."""

    __slots__ = ("_checks",)

    def __init__(self) -> None:
        self._checks: dict[int, _ProgramCheck] = {}

    def check(self, program: OptimizedProgram) -> bool:
        found = self._checks.get(id(program))
        if found is None or found.program is not program:
            if len(self._checks) > 16:  # programs of observable sets no longer asked for
                self._checks.clear()
            found = self._checks[id(program)] = _ProgramCheck(program)
        return found.check()

    def forget(self) -> None:
        """Drop the answers: a param was written where its version does not show it."""
        for found in self._checks.values():
            found.entry = None

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy (pickle, ``copy.deepcopy``) starts without the answers: it checks its own
        params."""
        return (FiniteParams, ())


class _ProgramCheck:
    __slots__ = ("program", "slots", "entry")

    def __init__(self, program: OptimizedProgram) -> None:
        self.program = program
        self.slots = blob_slots(unfolded_layers(program))  # read on each check
        self.entry: tuple[Key, bool] | None = None

    def check(self) -> bool:
        blobs = read_slots(self.slots)
        try:
            key = (data_watch.touches, [(t._version, t.data_ptr()) for t in blobs])
        except RuntimeError:
            return False  # inference tensors (a net built under inference_mode): no versions
        entry = self.entry
        if entry is None or entry[0] != key:
            with torch.no_grad():
                finite = all(t.is_cpu and bool(torch.isfinite(t).all()) for t in blobs)
            entry = self.entry = (key, finite)
        return entry[1]
