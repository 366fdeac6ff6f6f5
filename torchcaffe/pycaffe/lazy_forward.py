"""The Caffe face's whole-net forward when no backward follows: the torch face's program.

A pycaffe script reads few blobs after ``forward()``, so this runs the inference program the
passes optimize for those only (under ``inference_mode``, as the torch face does): the outputs,
the loss tops, the blobs a data view taken earlier still shows, and the blobs read since the
previous forward. Blobs are written lazily (``SyncedMemory.defer``): a blob a live view shows
is written at once (the view must show the new values, as pycaffe's do); any other waits for
its first access. A blob the program does not materialize (a fold's intermediate) is, on first
access, computed by the literal layer-by-layer program from this forward's inputs, and the
next forward's program keeps it. Only nets whose layers are pure functions of their bottoms take
this path (recomputing must neither read a new batch nor update state), and not nets that share
params with another net (a solver's updates would reach them unseen). Before a param of the
net is written through the Caffe face, ``settle`` recomputes what is left out with the params
the forward used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial

import torch

from ..blob import Blob
from ..net.net import TorchNet
from ..net.passes import OptimizedProgram

# Layer types whose forward has effects beyond its tops (user code, files written).
IMPURE_TYPES = frozenset({"Python", "HDF5Output"})


def layer_tops(net: TorchNet) -> frozenset[str]:
    """The blobs some layer other than an Input writes (an input among them is overwritten
    in place)."""
    return frozenset(t for step in net.steps if not step.is_input for t in step.tops)


def replayable(net: TorchNet) -> bool:
    """Can every blob be recomputed later from the inputs alone, with nothing changing?"""
    if net.training:
        return False
    for step in net.steps:
        if step.is_input:
            continue
        module = net.module_of(step)
        if not step.bottoms or step.type in IMPURE_TYPES:
            return False  # a data layer (reads the next batch) or user code
        if getattr(module, "uses_global_stats", True) is False:
            return False  # batch statistics update the running averages
        if getattr(module, "sample_weights_test", False):
            return False  # a random mask at test time
    return True


class _Run:
    """One forward's values: the program's tensors, and the replay for the rest (on demand)."""

    def __init__(
        self,
        owner: LazyForward,
        produced: dict[str, torch.Tensor],
        inputs: dict[str, torch.Tensor],
    ) -> None:
        self.owner = owner
        self.produced = produced
        self.inputs = inputs
        self.replayed: dict[str, torch.Tensor] | None = None
        self.left_out = False  # some blob defers to the replay

    def computed(self, name: str) -> torch.Tensor:
        self.owner.read.add(name)
        return self.produced[name]

    def folded(self, name: str) -> torch.Tensor:
        """A blob the program left out: every blob from the inputs, once per forward."""
        self.owner.read.add(name)
        return self.replay()[name]

    def replay(self) -> dict[str, torch.Tensor]:
        if self.replayed is None:  # the literal program: Caffe's values, no fold's rounding
            with torch.inference_mode():
                self.replayed = self.owner.net.run(dict(self.inputs))
            self.owner.replays += 1
        return self.replayed


class LazyForward:
    """Whole-net inference forwards for one Caffe-face Net (see the module docstring)."""

    def __init__(
        self, net: TorchNet, blobs: Mapping[str, Blob], loss_weights: Mapping[str, float]
    ) -> None:
        self.net = net
        self.blobs = blobs
        self.loss_weights = {n: w for n, w in loss_weights.items() if w}
        self.read: set[str] = set()  # blobs accessed since the last forward
        self.replays = 0  # how many forwards had to recompute a left-out blob (tests read it)
        self.last_program: OptimizedProgram | None = None
        self._always = frozenset(net.output_names) | frozenset(self.loss_weights)
        # input blobs no layer overwrites in place: a run leaves them as they were (one a
        # layer overwrites ends with that layer's top, as Caffe's shared Blob does)
        self._kept_inputs = frozenset(net.input_names) - layer_tops(net)
        self._input_shapes: dict[str, tuple[int, ...]] | None = None
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._replayable: dict[bool, bool] = {}
        self._run: _Run | None = None
        self._written: tuple[tuple[str, Blob], ...] | None = None  # every blob a run writes
        self.shares_params = False  # set by Net.share_with: the lazy path is off

    def settle(self) -> None:
        """Recompute now what the last forward left out, before its params change."""
        run = self._run
        if run is not None and run.left_out and run.replayed is None:
            run.replay()

    @property
    def applies(self) -> bool:
        """This net's layers can run as one optimized program with blobs computed later."""
        if self.shares_params:
            return False
        mode = self.net.training
        if mode not in self._replayable:
            self._replayable[mode] = replayable(self.net)
        return self._replayable[mode]

    def forward(
        self,
        device: torch.device,
        observe: Iterable[str],
        reshape: Callable[[str, tuple[int, ...]], None],
    ) -> float:
        """Run the net; ``observe``: blobs the caller reads now; ``reshape(name, shape)``
        reshapes a blob (with its loss diff). Returns the loss."""
        net, blobs = self.net, self.blobs
        with torch.inference_mode():
            inputs = {n: blobs[n].data_at(device).clone() for n in net.input_names}
        shapes = self._shapes_for(inputs)
        written = self._written
        if written is None:  # the blobs layers write, in the net's order (fixed after build)
            written = self._written = tuple(
                (name, blob) for name, blob in blobs.items() if name not in self._kept_inputs
            )
        watched = {name for name, blob in written if blob.data_memory.viewed()}
        seen = self._always | watched | self.read | frozenset(observe)
        self.read = set()
        program = net.optimized_program(seen, device)  # named: no walk over the params
        self.last_program = program
        with torch.inference_mode():
            produced = net.run(dict(inputs), program=program)
        run = self._run = _Run(self, produced, inputs)
        on_gpu = device.type != "cpu"
        computed, folded = run.computed, run.folded
        for name, blob in written:
            kept = name in seen and name in produced
            shape = tuple(produced[name].shape) if kept else shapes[name]
            if blob.shape != shape:
                reshape(name, shape)
            if name in watched:  # a live view shows the new value now
                value = produced[name] if kept else run.replay()[name]
                blob.data_memory.drop_deferred()
                blob.data_at(device, mutable=True).copy_(value)
            elif kept:
                blob.data_memory.defer(partial(computed, name), on_gpu)
            else:
                blob.data_memory.defer(partial(folded, name), on_gpu)
                run.left_out = True
        loss = 0.0
        for name, w in self.loss_weights.items():
            top = produced[name] if name in produced else run.replay()[name]
            loss += w * float(top.sum())
        return loss

    def _shapes_for(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
        """Every blob's shape, inferred once per input shapes (Caffe's Net::Reshape)."""
        shapes = {n: tuple(t.shape) for n, t in inputs.items()}
        if shapes != self._input_shapes:
            inferred = self.net.infer_shapes(shapes)
            self._shapes = {n: tuple(int(d) for d in s) for n, s in inferred.items()}
            self._input_shapes = shapes
        return self._shapes
