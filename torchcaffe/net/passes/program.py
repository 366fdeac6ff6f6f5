"""The program the passes transform: steps plus one runner per step key."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from ..program import LayerStep

Runner = Callable[..., Any]
# (runner key or None, bottoms, propagate_down, tops, blobs released after the step)
WalkEntry = tuple[str | None, tuple[str, ...], tuple[bool, ...], tuple[str, ...], tuple[str, ...]]
# An eager run's step: (runner, bottoms, propagate_down or None when every bottom propagates,
# tops, blobs released after the step); Input steps have none
EagerStep = tuple[
    Runner, tuple[str, ...], tuple[bool, ...] | None, tuple[str, ...], tuple[str, ...]
]


@dataclass(frozen=True)
class OptimizedProgram:
    """Steps to run and the callable for each step key (modules, or a pass's derived runner).

    ``report`` maps a pass name to how many steps it rewrote (tests read it to see a pass fired).
    ``releases`` (see ``with_releases``) names, per step, the blobs to drop once it has run.
    ``walk`` is what a run reads, per step: (runner key, None for an Input; bottoms; their
    propagate_down; tops; releases). It holds only strings, bools and None, so torch.compile
    guards it as one value instead of each step's fields: ResNet-50's compiled forward went
    from ~10,500 guard lines to ~8,000 and its guard check from 1.37 to 1.26 ms a call (the
    hand-written model's: ~5,300 and 0.56 ms; the rest guards what the runners read).
    ``traced_runners`` is what that walk calls: each runner, or the ``traced_runner`` of one
    that only passes its bottoms on under torch.compile (``ChannelsLastInput``), so the guards
    skip the wrapper.
    """

    steps: tuple[LayerStep, ...]
    runners: Mapping[str, Runner]
    report: Mapping[str, int] = field(default_factory=dict)
    releases: tuple[tuple[str, ...], ...] = ()
    # steps that take a faster form in a run whose values are finite (plain ReLUs in oneDNN's
    # epilogue, MAX poolings without their NaN check; ``passes/finite.py``): ``TorchNet``
    # checks the run's inputs and params only where there are some
    finite_steps: int = 0
    # the eager walk calls each runner as a module (``literal``: its hooks run), not its
    # ``forward``
    module_calls: bool = False
    walk: tuple[WalkEntry, ...] = field(init=False, repr=False, compare=False)
    eager_walk: tuple[EagerStep, ...] = field(init=False, repr=False, compare=False)
    traced_runners: Mapping[str, Runner] = field(init=False, repr=False, compare=False)
    input_releases: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        releases = self.releases or ((),) * len(self.steps)
        walk = tuple(
            (None if s.is_input else s.key, s.bottoms, s.propagate_down, s.tops, dead)
            for s, dead in zip(self.steps, releases)
        )
        object.__setattr__(self, "walk", walk)
        eager = tuple(
            (
                self.runners[key] if self.module_calls else _eager_callable(self.runners[key]),
                bottoms,
                None if all(keeps) else keeps,
                tops,
                dead,
            )
            for key, bottoms, keeps, tops, dead in walk
            if key is not None
        )
        object.__setattr__(self, "eager_walk", eager)
        traced = {key: getattr(r, "traced_runner", r) for key, r in self.runners.items()}
        object.__setattr__(self, "traced_runners", traced)
        # what Input steps release: no step reads those blobs, so they go before the first
        inputs = tuple(b for key, _, _, _, dead in walk if key is None for b in dead)
        object.__setattr__(self, "input_releases", inputs)

    def inner_runners(self) -> list[Runner]:
        """Each step's runners without the passes' wrappers around them (a layout pass's, a
        fused ReLU's, a group's): the layers and folds that compute its tops."""
        return [inner for runner in self.runners.values() for inner in _unwrapped(runner)]

    def derived_caches(self) -> list[Any]:
        """The runners, wrappers included, that keep values derived from the params (each has
        ``forget``): folds, groups of merged steps."""
        found: list[Any] = []
        pending = list(self.runners.values())
        while pending:
            runner = pending.pop()
            if hasattr(runner, "forget"):
                found.append(runner)
            pending += getattr(runner, "members", ())
            if hasattr(runner, "runner"):
                pending.append(runner.runner)
        return found

    @classmethod
    def unoptimized(
        cls, steps: list[LayerStep], modules: Mapping[str, nn.Module] | nn.ModuleDict
    ) -> OptimizedProgram:
        return cls(tuple(steps), {s.key: modules[s.key] for s in steps}, {})

    @classmethod
    def literal(
        cls, steps: list[LayerStep], modules: Mapping[str, nn.Module] | nn.ModuleDict
    ) -> OptimizedProgram:
        """Caffe's layer-by-layer program, each layer called as a module (its hooks run), to
        run with releases (``with_releases``): a net whose layers are hooked, or with the
        passes off, frees an intermediate after its last reader too."""
        return replace(cls.unoptimized(steps, modules), module_calls=True)

    def rewritten(
        self, name: str, steps: list[LayerStep], new_runners: Mapping[str, Runner], count: int
    ) -> OptimizedProgram:
        runners = {s.key: new_runners.get(s.key) or self.runners[s.key] for s in steps}
        report = {**self.report, name: count}
        return OptimizedProgram(tuple(steps), runners, report, finite_steps=self.finite_steps)

    def with_releases(self, observable: frozenset[str]) -> OptimizedProgram:
        """This program with, per step, the blobs no later step reads or writes and the caller
        does not observe. The run drops them after that step, so an intermediate is freed
        when its last reader has run (as a torch model's locals are) instead of when the
        forward returns: peak memory, and the fresh pages the allocator must fault in, stay
        those of the hand-written model (autograd keeps what it saved either way)."""
        last: dict[str, int] = {}
        for i, step in enumerate(self.steps):
            for blob in (*step.bottoms, *step.tops):
                last[blob] = i
        releases: list[list[str]] = [[] for _ in self.steps]
        for blob, i in last.items():
            if blob not in observable:
                releases[i].append(blob)
        return replace(self, releases=tuple(tuple(r) for r in releases))


def _eager_callable(runner: Runner) -> Runner:
    """What an eager run calls for ``runner``: a layer's own ``forward`` where calling the
    module would only reach it through ``nn.Module.__call__`` (two Python frames and its
    hook checks a layer, host time a GPU's eager run is bound by). A run reaches the program
    only while no hook watches a layer and no layer was given a ``forward`` after it was built
    (``TorchNet.layers_hooked``; else each layer is called as a module), so the ``forward``
    bound here stays the one a module call would reach. A module not of torchcaffe's own (one
    a user put in ``net.layers``) is called as a module: a hook registered on it later
    bumps no count that a net watches."""
    if not isinstance(runner, nn.Module) or type(runner).__call__ is not nn.Module.__call__:
        return runner
    if not type(runner).__module__.startswith("torchcaffe."):
        return runner
    return runner.forward


def _unwrapped(runner: Runner) -> list[Runner]:
    """The layers or folds ``runner`` runs: itself, or those of the runner it wraps
    (``runner``) or of each step it merges (``members``)."""
    members = getattr(runner, "members", None)
    if members is not None:
        return [inner for member in members for inner in _unwrapped(member)]
    wrapped = getattr(runner, "runner", None)
    return [runner] if wrapped is None else _unwrapped(wrapped)


def step_kind(step: LayerStep) -> str:
    """The Caffe type of a step, or of the first layer of a fused one (``BatchNorm+Scale``)."""
    return step.type.split("+")[0]


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


def bottom_producers(steps: Sequence[LayerStep]) -> list[tuple[int | None, ...]]:
    """For each step, the step whose write each of its bottoms reads (None: an input), all in
    one scan (a backward search per step made a blob with thousands of readers quadratic)."""
    last: dict[str, int] = {}
    out: list[tuple[int | None, ...]] = []
    for i, step in enumerate(steps):
        out.append(tuple(last.get(b) for b in step.bottoms))
        last.update((t, i) for t in step.tops)
    return out


class StepMerges:
    """One pass's rewrites that merge a step with steps after it (a fold, a fusion): step i
    becomes one runner named after the merged types, with the last merged step's tops, and
    the absorbed steps leave the program."""

    def __init__(self, program: OptimizedProgram) -> None:
        self.program = program
        self._absorbed: set[int] = set()
        self._merged: dict[int, LayerStep] = {}
        self._runners: dict[str, Runner] = {}

    def absorbed(self, i: int) -> bool:
        return i in self._absorbed

    def merge(
        self,
        i: int,
        chain: Sequence[tuple[int, LayerStep]],
        runner: Runner,
        suffix: str,
        tops: tuple[str, ...],
    ) -> None:
        """Step ``i`` and the (index, step) ``chain`` after it run as ``runner``."""
        step = self.program.steps[i]
        key = f"{step.key}+{suffix}"
        self._runners[key] = runner
        merged_type = "+".join([step.type] + [s.type for _, s in chain])
        self._merged[i] = replace(step, type=merged_type, key=key, tops=tops)
        self._absorbed.update(j for j, _ in chain)

    def result(self, name: str) -> OptimizedProgram:
        steps = self.program.steps
        kept = [self._merged.get(i, s) for i, s in enumerate(steps) if i not in self._absorbed]
        return self.program.rewritten(name, kept, self._runners, len(self._merged))
