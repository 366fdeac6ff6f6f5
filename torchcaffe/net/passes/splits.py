"""bypass_splits: the readers of an unobserved Split's tops read its bottom instead.

Caffe inserts a Split wherever a blob has several readers, and its tops share the bottom's
data. Run as a layer, a Split is one more step per fan-out, each top a view: on a GPU, where
a run is bound by the host's work per layer, GoogLeNet's 9 and ResNet-50's 16 Splits cost
that work for nothing. Readers reading the bottom itself compute the same values: no
inference runner writes its bottom in place unless it is that value's only reader
(``inplace_relu``), and a Split whose bottom is rewritten before its last reader has read a
top stays. For autograd (``bypass_splits_for_training``) the readers' gradients then sum in
one buffer, as for a tensor a torch model reads twice.
"""

from __future__ import annotations

import dataclasses

from ..program import LayerStep
from .program import OptimizedProgram

PASS_NAME = "bypass_splits"


def _split_ok(step: LayerStep, observable: frozenset[str]) -> bool:
    return (
        step.type == "Split"
        and len(step.bottoms) == 1
        and all(step.propagate_down)
        and not any(step.loss_weights)
        and not observable.intersection(step.tops)
    )


def _readers_of_tops(steps: list[LayerStep], index: int) -> dict[str, list[int]]:
    """``readers_of`` each top of step ``index``, in one scan of the steps after it (a top
    at a time made a blob with thousands of readers quadratic)."""
    tops = steps[index].tops
    readers: dict[str, list[int]] = {top: [] for top in tops}
    unwritten = set(tops)
    for j in range(index + 1, len(steps)):
        if not unwritten:
            break
        for top in unwritten.intersection(steps[j].bottoms):
            readers[top].append(j)
        unwritten.difference_update(steps[j].tops)
    return readers


def bypass_unobserved_splits(
    program: OptimizedProgram, observable: frozenset[str], pass_name: str
) -> OptimizedProgram:
    """Every Split no caller observes, removed, its readers reading its bottom; the report
    counts them under ``pass_name``."""
    steps = list(program.steps)
    removed: set[int] = set()
    for i, step in enumerate(steps):
        if not _split_ok(step, observable):
            continue
        source = step.bottoms[0]
        readers = _readers_of_tops(steps, i)
        # not max(..., default=i): a compiled forward may build this program while dynamo
        # traces it, and dynamo breaks the graph on max's default
        last = max([i, *(j for js in readers.values() for j in js)])
        if any(source in steps[k].tops for k in range(i + 1, last + 1)):
            continue  # the bottom is rewritten before a reader would read it
        for top, js in readers.items():
            for j in js:
                bottoms = tuple(source if b == top else b for b in steps[j].bottoms)
                steps[j] = dataclasses.replace(steps[j], bottoms=bottoms)
        removed.add(i)
    new_steps = [s for i, s in enumerate(steps) if i not in removed]
    return program.rewritten(pass_name, new_steps, {}, len(removed))


def bypass_splits(program: OptimizedProgram, observable: frozenset[str]) -> OptimizedProgram:
    """The inference pass (``bypass_unobserved_splits``)."""
    return bypass_unobserved_splits(program, observable, PASS_NAME)
