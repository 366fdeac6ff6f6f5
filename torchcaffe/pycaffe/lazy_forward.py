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

Every blob's memory follows one ``BulkDeferral``: a forward whose input shapes are those of the
last one, with no blob reshaped or given another memory since (``forget_link``),
defers them all with one call and looks for live views only among the memories accessed
since, touching no other blob: a run leaves those Python objects cold in cache, where a walk
over MobileNetV2's 140 blobs cost ~0.3 ms. Other forwards walk every blob.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

from ..blob import Blob
from ..net.net import TorchNet
from ..net.passes import OptimizedProgram
from ..syncedmem import BulkDeferral, SyncedMemory

# Layer types whose forward has effects beyond its tops (user code, files written).
IMPURE_TYPES = frozenset({"Python", "HDF5Output"})


def layer_tops(net: TorchNet) -> frozenset[str]:
    """The blobs some layer other than an Input writes (an input among them is overwritten
    in place)."""
    return frozenset(t for step in net.steps if not step.is_input for t in step.tops)


def data_shaped_blobs(net: TorchNet) -> frozenset[str]:
    """The blobs whose shape only the values tell: the tops of a layer whose top shape
    depends on the data (a Filter, a Proposal, a DetectionOutput) and of every layer after
    it that reads one. Inferred shapes cannot give them, so a forward always keeps them."""
    found: set[str] = set()
    for step in net.steps:
        module = net.module_of(step)
        if getattr(module, "shape_depends_on_data", False) or found.intersection(step.bottoms):
            found.update(step.tops)
    return frozenset(found)


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
        if getattr(module, "carries_state", False):
            return False  # an RNN or LSTM starts from the state the last forward left
    return True


class _Run:
    """One forward's values: the program's tensors, and the replay for the rest (on demand)."""

    def __init__(
        self,
        owner: LazyForward,
        produced: dict[str, torch.Tensor],
        inputs: dict[str, torch.Tensor],
        kept: frozenset[str],
    ) -> None:
        self.owner = owner
        self.produced = produced
        self.inputs = inputs
        self.kept = kept  # the blobs whose value in ``produced`` is Caffe's
        self.replayed: dict[str, torch.Tensor] | None = None
        self.left_out = False  # some blob defers to the replay

    def value(self, name: str) -> torch.Tensor:
        """Blob ``name``'s value after this forward, read by the script (the next forward
        keeps it)."""
        self.owner.read.add(name)
        return self.at(name)

    def at(self, name: str) -> torch.Tensor:
        """Blob ``name``'s value after this forward."""
        if name in self.kept:
            return self.produced[name]
        return self.replay()[name]  # a blob the program left out

    def replay(self) -> dict[str, torch.Tensor]:
        if self.replayed is None:  # the literal program: Caffe's values, no fold's rounding
            with torch.inference_mode():
                self.replayed = self.owner.net.run(dict(self.inputs))
            self.owner.replays += 1
        return self.replayed


class LazyForward:
    """Whole-net inference forwards for one Caffe-face Net (see the module docstring)."""

    def __init__(
        self,
        net: TorchNet,
        blobs: Mapping[str, Blob],
        loss_weights: Mapping[str, float],
        keys: Mapping[str, str | None] | None = None,
    ) -> None:
        self.net = net
        self.blobs = blobs
        # blob -> the blob whose value its memory takes (blobs sharing one memory, as
        # Caffe's Flatten top and its bottom, take the last one written); None: no layer
        # writes that memory (a Reshape of an input)
        self.keys: Mapping[str, str | None] = keys or {}
        # a blob shown through another's memory -> that one, whose value it then needs
        self._through = {n: k for n, k in self.keys.items() if k is not None and k != n}
        self.loss_weights = {n: w for n, w in loss_weights.items() if w}
        self.read: set[str] = set()  # blobs accessed since the last forward
        self.replays = 0  # how many forwards had to recompute a left-out blob (tests read it)
        self.last_program: OptimizedProgram | None = None
        # outputs, losses and the blobs whose shape only a run can give: always kept
        always = frozenset(net.output_names) | frozenset(self.loss_weights) | data_shaped_blobs(net)
        self._always = always | {self._through[n] for n in always if n in self._through}
        # input blobs no layer overwrites in place: a run leaves them as they were (one a
        # layer overwrites ends with that layer's top, as Caffe's shared Blob does)
        self._kept_inputs = frozenset(net.input_names) - layer_tops(net)
        self._input_shapes: dict[str, tuple[int, ...]] | None = None
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._replayable: dict[bool, bool] = {}
        self._run: _Run | None = None
        self._written: tuple[tuple[str, Blob], ...] | None = None  # every blob a run writes
        self._written_names: frozenset[str] = frozenset()
        self._keys: frozenset[str] = frozenset()  # the blobs whose value a memory takes
        self._bulk = BulkDeferral()  # every written blob's data memory follows it
        self._linked_memories: frozenset[SyncedMemory] = frozenset()
        # what held when a forward last linked every blob, each of its inferred shape: the
        # inferred shapes (the dict ``_shapes_for`` keeps per input shapes) and the side.
        # Dropped when a blob is reshaped or given another memory (``on_layout_change``); a
        # forward that finds it defers every blob with one ``advance``.
        self._link: tuple[Mapping[str, tuple[int, ...]], bool] | None = None
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
            inputs = {n: blobs[n].data_copy_at(device) for n in net.input_names}
        shapes = self._shapes_for(inputs)
        written = self._written_blobs()
        on_gpu = device.type != "cpu"
        link = self._link
        linked = link is not None and link[0] is shapes and link[1] == on_gpu
        if linked:  # a memory gains a view only through an access: look at those accessed
            watched = self._viewed_touched()
        else:
            watched = {
                key
                for name, blob in written
                if (key := self._key(name)) is not None and blob.data_memory.viewed()
            }
        seen = self._always | watched | self.read | frozenset(observe)
        if self._through:
            seen |= {self._through[n] for n in observe if n in self._through}
        self.read = set()
        program = net.optimized_program(seen, device)  # named: no walk over the params
        self.last_program = program
        with torch.inference_mode():
            produced = net.run(dict(inputs), program=program)
        kept = frozenset(name for name in seen if name in produced)
        run = self._run = _Run(self, produced, inputs, kept)
        run.left_out = not self._keys <= kept  # some blob defers to the replay
        if linked and self._inferred_shapes_hold(run, shapes):
            self._bulk.advance(run.value, on_gpu)  # every blob deferred to this run at once
        else:
            self._link_all(run, shapes, on_gpu, reshape)
        for name in watched:  # a live view shows the new value now
            self._write_now(name, run, device)
        loss = 0.0
        for name, w in self.loss_weights.items():
            top = produced[name] if name in produced else run.replay()[name]
            loss += w * float(top.sum())
        return loss

    def _key(self, name: str) -> str | None:
        return self.keys.get(name, name)

    def _written_blobs(self) -> tuple[tuple[str, Blob], ...]:
        """The blobs layers write, in the net's order (fixed after build)."""
        if self._written is None:
            self._written = tuple(
                (name, blob) for name, blob in self.blobs.items() if name not in self._kept_inputs
            )
            self._written_names = frozenset(name for name, _ in self._written)
            self._keys = frozenset(
                key for name, _ in self._written if (key := self._key(name)) is not None
            )
        return self._written

    def _viewed_touched(self) -> set[str]:
        """The blobs a live view shows, among the memories accessed since the last look
        (those found unviewed are forgotten: a new view needs a new access)."""
        touched = self._bulk.touched
        viewed = [memory for memory in touched if memory.viewed()]
        touched.clear()
        touched.update(viewed)
        return {key for memory in viewed if (key := memory.linked_key) is not None}

    def _inferred_shapes_hold(self, run: _Run, shapes: Mapping[str, tuple[int, ...]]) -> bool:
        """Do the blobs the run kept have their inferred shapes (a layer whose top's shape
        depends on the data, as a detection output, may give another)?"""
        produced, written = run.produced, self._written_names
        return all(
            tuple(produced[name].shape) == shapes[name] for name in run.kept if name in written
        )

    def _link_all(
        self,
        run: _Run,
        shapes: Mapping[str, tuple[int, ...]],
        on_gpu: bool,
        reshape: Callable[[str, tuple[int, ...]], None],
    ) -> None:
        """Shape every blob for ``run`` and defer it to ``run`` through the bulk deferral;
        keep the state a later forward must find to defer them all at once."""
        written, bulk = self._written_blobs(), self._bulk
        for name, blob in written:
            shape = tuple(run.produced[name].shape) if name in run.kept else shapes[name]
            if blob.shape != shape:
                reshape(name, shape)  # may give the blob a new memory
        links: dict[SyncedMemory, str] = {}  # one key per memory: the value it holds
        for name, blob in written:
            key = self._key(name)
            if key is not None:
                memory = blob.data_memory
                links[memory] = key if memory is self.blobs[key].data_memory else name
        for memory in self._linked_memories - set(links):
            memory.unlink()  # before the advance: it keeps the value it has now
        bulk.advance(run.value, on_gpu)
        for memory, key in links.items():
            memory.link(bulk, key)
        bulk.touched.clear()  # the viewed blobs' writes, which follow, note them again
        self._linked_memories = frozenset(links)
        inferred = all(blob.shape == shapes[name] for name, blob in written)
        self._link = (shapes, on_gpu) if inferred else None

    def forget_link(self) -> None:
        """A blob was reshaped or given another memory: the next forward links all again
        (its owner calls this from ``Blob.on_layout_change``)."""
        self._link = None

    def _write_now(self, name: str, run: _Run, device: torch.device) -> None:
        value = run.at(name)
        self.blobs[name].data_to_overwrite(device).copy_(value)

    def _shapes_for(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
        """Every blob's shape, inferred once per input shapes (Caffe's Net::Reshape)."""
        shapes = {n: tuple(t.shape) for n, t in inputs.items()}
        if shapes != self._input_shapes:
            inferred = self.net.infer_shapes(shapes)
            self._shapes = {n: tuple(int(d) for d in s) for n, s in inferred.items()}
            self._input_shapes = shapes
        return self._shapes
