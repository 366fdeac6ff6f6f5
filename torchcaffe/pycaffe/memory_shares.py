"""Which Caffe-face blobs share one memory, and what that means for the net's passes.

Caffe's layers make some tops use their bottom's Blob memory (Blob::ShareData/ShareDiff):
every Split top shares its bottom's data (SplitLayer::Forward; the diffs stay apart, summed by
its Backward); the top of Flatten, Reshape, a one-bottom Concat and a one-top Slice shares data
and diff (their Reshape or Forward; FlattenLayer::Backward gives the bottom the top's diff). A
script writing one blob then sees the other change, as pycaffe's arrays over the one buffer
do, and a layer writing such a top in place writes its bottom too. This module reads that off
the net's steps once, at build; ``pycaffe/net.py`` gives the Blobs their shared memories.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..net.program import LayerStep
from ..ops.base import CaffeLayer
from .backward_reads import relu_in_place

_DATA_AND_DIFF = ("Flatten", "Reshape", "Concat", "Slice")  # of one bottom and one top
# in-place layers after a ReLU that leave the effect of its mask (bottom_data > 0) alone: a
# Dropout zeroes the diff wherever it zeroes the data, else scales by a positive factor
_MASK_KEEPING = ("Dropout", "ReLU")


@dataclass(frozen=True)
class MemoryShares:
    """The shares of one net's steps. ``pairs``: (top, bottom, diff too), in layer order so
    that a chain (a Split top flattened) shares one memory; ``shared_writes``: (layer index,
    top) of those tops -> the bottom (their forward writes no values: they are already there);
    ``root``: a sharing top -> the blob that owns the memory."""

    steps: Sequence[LayerStep]
    pairs: tuple[tuple[str, str, bool], ...]
    shared_writes: dict[tuple[int, str], str]
    root: dict[str, str]
    written_from: list[set[str]] = field(init=False)

    @classmethod
    def of(cls, steps: Sequence[LayerStep]) -> MemoryShares:
        pairs: list[tuple[str, str, bool]] = []
        shared_writes: dict[tuple[int, str], str] = {}
        root: dict[str, str] = {}
        for i, step in enumerate(steps):
            kind, bottoms, tops = step.type, step.bottoms, step.tops
            if kind == "Split" and len(bottoms) == 1:
                share = [(top, bottoms[0], False) for top in tops]
            elif kind in _DATA_AND_DIFF and len(bottoms) == len(tops) == 1:
                share = [(tops[0], bottoms[0], True)]
            else:
                continue
            for top, bottom, diff in share:
                if top != bottom:
                    pairs.append((top, bottom, diff))
                    shared_writes[(i, top)] = bottom
                    root[top] = root.get(bottom, bottom)
        return cls(steps, tuple(pairs), shared_writes, root)

    def __post_init__(self) -> None:
        # per layer index i (and one past the last): the memories layers i and after write
        out: list[set[str]] = [set() for _ in range(len(self.steps) + 1)]
        for i in range(len(self.steps) - 1, -1, -1):
            out[i] = out[i + 1] | {self.memory(t) for t in self.written_tops(i)}
        object.__setattr__(self, "written_from", out)

    def memory(self, blob: str) -> str:
        """The blob that owns ``blob``'s memory (itself where it shares none)."""
        return self.root.get(blob, blob)

    def written_tops(self, i: int) -> list[str]:
        """Layer ``i``'s tops it writes values into (not those that are its bottom's memory)."""
        return [t for t in self.steps[i].tops if (i, t) not in self.shared_writes]

    def keys(self, blob_names: Iterable[str]) -> dict[str, str | None]:
        """Blob -> the blob whose value its memory holds after a whole forward: of the blobs
        sharing one memory, the last one a layer writes values into (a layer in place on a
        flattened top writes its bottom's memory); None where no layer does (a Reshape of an
        input: the memory is the input's)."""
        last: dict[str, str] = {}
        for i, step in enumerate(self.steps):
            if not step.is_input:
                for top in self.written_tops(i):
                    last[self.memory(top)] = top
        return {name: last.get(self.memory(name)) for name in blob_names}

    def overwritten_bottoms(self) -> list[list[bool]]:
        """Per layer and bottom: will this or a later layer overwrite the blob's memory (in
        place, or in place on a blob sharing it)?"""
        later = self.written_from
        return [[self.memory(b) in later[i] for b in s.bottoms] for i, s in enumerate(self.steps)]

    def rewritten_tops(self) -> list[bool]:
        """Per layer: does a later layer write its first top's memory (in place, or in place
        on a blob sharing it)? A Backward that reads that top (Sigmoid, TanH, an in-place
        slope) then reads what the later layer left."""
        later = self.written_from
        return [
            bool(step.tops) and self.memory(step.tops[0]) in later[i + 1]
            for i, step in enumerate(self.steps)
        ]

    def relu_masks_moved(self, module_of: Callable[[LayerStep], CaffeLayer]) -> frozenset[int]:
        """The in-place ReLUs whose blob a later layer rewrites with values of another sign
        pattern (a Scale or BatchNorm in place after it): Caffe's Backward masks with
        bottom_data > 0, which is then that layer's output."""
        moved = set()
        for i, step in enumerate(self.steps):
            if not relu_in_place(step):
                continue
            blob = self.memory(step.tops[0])
            for j in range(i + 1, len(self.steps)):
                later = self.steps[j]
                if not any(self.memory(t) == blob for t in self.written_tops(j)):
                    continue
                if later.type not in _MASK_KEEPING or (
                    later.type == "ReLU" and module_of(later).param.negative_slope < 0
                ):
                    moved.add(i)
        return frozenset(moved)

    def stale_alias_reads(self) -> bool:
        """Does a layer read a blob whose shared memory another blob's layer wrote since the
        blob was last produced (a ReLU in place on a Flatten top, then a Reshape of the same
        bottom read)? Caffe's reader sees that write through the memory; the torch face's
        program hands each blob its own value, so such nets run layer by layer."""
        produced: dict[str, int] = {}  # blob -> the step that last gave it its value
        written: dict[str, int] = {}  # memory -> the step that last wrote values into it
        writer: dict[str, str] = {}  # memory -> the blob that step wrote
        for i, step in enumerate(self.steps):
            for b in step.bottoms:
                r = self.memory(b)
                if writer.get(r, b) != b and written[r] > produced.get(b, -1):
                    return True
            for t in step.tops:
                produced[t] = i
            for t in self.written_tops(i):
                r = self.memory(t)
                written[r], writer[r] = i, t
        return False
