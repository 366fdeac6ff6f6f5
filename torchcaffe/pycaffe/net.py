"""The Caffe face: ``caffe.Net`` with pycaffe's blobs/params/forward/backward semantics.

It drives the compiled torch Net layer by layer, as Caffe's Net::ForwardFromTo and
BackwardFromTo do: every blob is a Blob with data and diff; each layer's backward reads its top
diffs and overwrites its bottom diffs, param diffs accumulate until cleared. Each layer's
gradient comes from autograd over that layer alone, so partial forward/backward (start/end)
and blobs edited between calls behave as in Caffe.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import runtime
from ..api import load, load_weights, save_weights
from ..blob import Blob, memories_at, watch_memories
from ..errors import (
    BlobWiringError,
    InputArrayError,
    LayerIndexError,
    LayerParamError,
    UnknownNameError,
    UsageError,
    WeightsError,
)
from ..formats.caffemodel import check_weights_file, is_hdf5
from ..net.net import TorchNet
from ..ops.base import CaffeLayer
from ..ops.data_watch import CaffeParameter
from ..ops.dummy_data import DummyDataLayer, holding_tops
from ..ops.python_layer import PythonLayer
from ..precision import caffe_float32, on_cuda
from ..proto import caffe_pb2
from ..syncedmem import Head, SyncedMemory
from . import debug_info
from .backward_reads import (
    keeps_forward_bottom,
    reads_bottom_data,
    slope_kept_when_overwritten,
    top_data_rule,
)
from .lazy_forward import LazyForward, layer_tops
from .memory_shares import MemoryShares
from .one_pass import OnePassPlan, forward_backward_one_pass, plan_one_pass


@dataclass
class _Record:
    bottoms: list[torch.Tensor]
    tops: tuple[torch.Tensor, ...]
    # the bottom blobs' data when the forward ended, for layers whose Caffe Backward reads it
    seen: list[torch.Tensor] | None = None
    # the bottoms' autograd versions when recorded: a later forward that writes a bottom's
    # memory in place (one over an earlier range) leaves the graph unusable
    versions: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.versions = tuple(b._version for b in self.bottoms)

    def bottoms_rewritten(self) -> bool:
        return any(b._version != v for b, v in zip(self.bottoms, self.versions))


def _compute_method(method):
    """A method that runs layers: in Caffe's IEEE float32 (``caffe_float32``) when the mode
    computes on CUDA, and afterwards, also when it raised part way, the param blobs its
    layers wrote in place on the device are marked so (``Net._note_layer_writes``)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            with caffe_float32(on_cuda(runtime.compute_device())):
                return method(self, *args, **kwargs)
        finally:
            self._note_layer_writes()

    return wrapper


class LayerView:
    """pycaffe's Layer object: ``type``, ``blobs`` and the underlying module. A Python layer
    is its own object instead (``pycaffe_layer``)."""

    def __init__(self, name: str, type_: str, module: nn.Module, blobs: list[Blob]) -> None:
        self.name = name
        self.type = type_
        self.module = module
        self.blobs = blobs

    def reshape(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        """Layer::Reshape: shape the ``top`` blobs for ``bottom``'s current shapes."""
        module = self.module
        if not isinstance(module, CaffeLayer):
            raise UsageError(f"layer '{self.name}' has no Caffe layer module to reshape")
        shapes = module.output_shapes([tuple(b.shape) for b in bottom])
        if len(shapes) != len(top):
            raise BlobWiringError(
                f"layer '{self.name}' ({self.type}): wrong number of top blobs",
                expected=len(shapes),
                got=len(top),
            )
        for blob, shape in zip(top, shapes):
            if tuple(blob.shape) != tuple(shape):
                blob.reshape(tuple(shape))

    def __repr__(self) -> str:
        return f"<Layer {self.name!r} ({self.type})>"


def pycaffe_layer(view: LayerView) -> Any:
    """What pycaffe's ``net.layers`` holds for a layer: a Python layer's own object (pycaffe
    wraps the script's instance, so its attributes and methods are the script's), else the
    view."""
    module = view.module
    return module.py if isinstance(module, PythonLayer) else view


class BlobLossWeights(list):
    """pycaffe's ``net._blob_loss_weights``: a list in blob order. Indexing by blob name
    (and ``get``) also works, for code that reads it as a mapping."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__([0.0] * len(names))
        self._index = {name: i for i, name in enumerate(names)}

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(self._index[key] if isinstance(key, str) else key)

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(self._index[key] if isinstance(key, str) else key, value)

    def get(self, name: str, default: float | None = None) -> float | None:
        return self[name] if name in self._index else default


def _slope_rule(module: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """An in-place neuron layer's Caffe Backward from the blob it shares with its bottom."""
    return module.in_place_backward


def _params_stale_count(on_cpu: bool) -> int:
    """A count that moves whenever a param's module side may go stale: on the CPU any
    memory's move to the device side alone (a param's host buffer is the module's
    tensor), in GPU mode a watched memory's move to the host side alone."""
    return SyncedMemory.device_heads if on_cpu else SyncedMemory.watched_host_heads


class Net:
    """``caffe.Net(network_file, phase)``, ``caffe.Net(network_file, weights, phase)``, or the
    keyword forms ``caffe.Net(network_file, phase=..., weights=..., level=..., stages=...)``."""

    def __init__(
        self,
        network_file: Any,
        *args: Any,
        phase: int | str | None = None,
        weights: str | os.PathLike | None = None,
        level: int = 0,
        stages: Sequence[str] | None = None,
        **load_options: Any,
    ) -> None:
        weights, phase, level, stages = _parse_net_args(args, weights, phase, level, stages)
        # pycaffe reads stages item by item: a string gives one stage per character
        stage_names = list(stages) if stages is not None else []
        self._net: TorchNet = load(
            network_file, None, phase, level=level, stages=stage_names, **load_options
        )
        self._device = torch.device("cpu")
        self._note_sources()
        # which blobs share one memory in Caffe (memory_shares.py)
        self._memory = MemoryShares.of(self._net.steps)
        self._shares_stale = True
        self._make_blobs()
        self._held_tops = self._constant_dummy_tops()
        self._lazy = LazyForward(
            self._net, self._blob_of, self._net.loss_weights(), self._memory.keys(self._blob_of)
        )
        for blob in self._blob_of.values():
            blob.on_layout_change = self._relaid
        # share_with: (layer index, param index) -> (the tensor put there, the source's tensor,
        # the source net); the nets either side of a share (their writes change ours)
        self._shared: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, Net]] = {}
        self._partners: weakref.WeakSet[Net] = weakref.WeakSet()
        self._following_shares = False
        self._binds = 0  # _bind_params calls: a solver re-reads its params when this moves
        self._bind_params()
        self._conversions = self._net.conversions  # the module's, when last bound to
        self._records: dict[int, _Record] = {}
        # pycaffe's per-layer callbacks (Net.before_forward & co.), by where they run
        self._callbacks: dict[str, list[Callable[[int], Any]]] = {
            k: [] for k in ("before_forward", "after_forward", "before_backward", "after_backward")
        }
        # Caffe's debug_info_: log each layer's blobs as it runs (debug_info.py); a solver
        # sets it per iteration as Caffe's Solver::Step does
        self._debug_info = bool(self._net.net_param.debug_info)
        self._overwritten = self._memory.overwritten_bottoms()
        self._top_rewritten = self._memory.rewritten_tops()
        # the blobs and param views follow these layers (``_ensure_device`` checks they stay)
        self._layer_changes = self._net.layer_changes
        self._relu_masks_moved = self._memory.relu_masks_moved(self._net.module_of)
        self._stale_alias_reads = self._memory.stale_alias_reads()
        self._layer_tops = layer_tops(self._net)  # what a forward writes (inputs: in place)
        # the layers that need backward, in order: a forward asks whether its range has one
        self._backward_steps = [i for i, s in enumerate(self._net.steps) if s.need_backward]
        self._refusals = self._find_backward_refusals()
        self._data_source = self._find_split_sources()
        # the input shapes the layer-by-layer (autograd) forwards last checked the net for
        # (load inferred the shapes the blobs start with)
        self._checked_input_shapes = {n: self._blob_of[n].shape for n in self._net.input_names}
        if weights is not None:
            self.copy_from(weights)

    # -- construction ---------------------------------------------------------------------
    def _note_sources(self) -> None:
        """Python layers name this prototxt in the notes on their errors."""
        for module in self._net.layers.values():
            if isinstance(module, PythonLayer):
                module.source_path = self._net.path

    def _share_blobs(self) -> None:
        """Give each sharing top its bottom's memory again where it lost it (a reshape that
        grew either one allocates anew), as Caffe's layers share again on each Reshape or
        Forward. Blobs of different counts (one reshaped, the other not yet) wait."""
        blobs = self._blob_of
        for top, bottom, diff in self._memory.pairs:
            t, b = blobs[top], blobs[bottom]
            if t.count != b.count:
                continue
            if t.data_memory is not b.data_memory:
                t.share_data(b)
            if diff and t.diff_memory is not b.diff_memory:
                t.share_diff(b)
        self._shares_stale = False

    def _relaid(self) -> None:
        """A blob was reshaped or given another memory (``Blob.on_layout_change``)."""
        self._shares_stale = True
        self._lazy.forget_link()

    def _make_blobs(self) -> None:
        """The blobs by the net's own (unique) names, and the views pycaffe shows: Caffe
        names every automatic top "(automatic)", so ``net.blobs`` (a dict zipped from
        ``_blob_names``) keeps that key at the first one's place with the last one's blob."""
        self._blob_of: OrderedDict[str, Blob] = OrderedDict(
            (name, Blob(self._net.blob_shapes[name])) for name in self._net.blob_names
        )
        self._share_blobs()  # before the loss diffs: a shared diff holds its top's weight
        automatic: set[str] = set()
        for step in self._net.steps:
            count = self._net.module_of(step).automatic_tops
            automatic.update(step.tops[len(step.tops) - count :] if count else ())
        self._pycaffe_names = [
            "(automatic)" if name in automatic else name for name in self._blob_of
        ]
        self.blobs = OrderedDict(zip(self._pycaffe_names, self._blob_of.values()))
        # a pycaffe name -> the blob it shows, by the net's name
        self._own_name = dict(zip(self._pycaffe_names, self._blob_of))
        self._blob_loss_weights = BlobLossWeights(list(self._blob_of))
        for step in self._net.steps:
            for top, w in zip(step.tops, step.loss_weights):
                if w:
                    self._blob_loss_weights[top] = w
                    self._blob_of[top].diff[...] = w  # Caffe's SetLossWeights

    def _bind_params(self) -> None:
        """One Blob per distinct param tensor, sharing memory with the module's tensors.

        Binding again (share_with, a device move) keeps the Blob objects a script may hold
        (``w = net.params['conv1'][0]``) and points them at the new memory, as Caffe's
        ShareData swaps a Blob's memory and keeps the Blob."""
        old_views = getattr(self, "_layer_views", [])
        by_tensor: dict[int, Blob] = {}
        reused: set[int] = set()
        self._param_users: dict[int, int] = {}  # param blob -> references to its memory, bare
        self._layer_views: list[LayerView] = []
        for i, step in enumerate(self._net.steps):
            module = self._net.module_of(step)
            if isinstance(module, PythonLayer):
                module.grads_on_blob_diffs()
            blobs = []
            for j, tensor in enumerate(module.param_blobs()):
                blob = by_tensor.get(id(tensor))
                if blob is None:
                    blob = self._param_blob(tensor)
                    held = old_views[i].blobs[j] if i < len(old_views) else None
                    if held is not None and held.shape == blob.shape and id(held) not in reused:
                        held.share_data(blob)
                        held.share_diff(blob)
                        blob = held
                        reused.add(id(held))
                    blob.before_write = functools.partial(self._param_may_change, blob)
                    by_tensor[id(tensor)] = blob
                blobs.append(blob)
            if isinstance(module, PythonLayer):
                module.share_param_diffs(blobs)
            self._layer_views.append(LayerView(step.name, step.type, module, blobs))
        self.layers: list[Any] = [pycaffe_layer(view) for view in self._layer_views]
        self._param_blob_of = by_tensor
        # handed out writable since the last run: blob -> (blob, references to it when bare)
        self._written_params: dict[int, tuple[Blob, int]] = {}
        # the counter that says whether a param's module side may have gone stale
        # (``_params_stale_count``) when every param was last found current there
        self._params_synced_at = -1
        for blob in by_tensor.values():
            self._param_users[id(blob)] = blob.data_memory.cpu_users()
        # the blobs a layer may update in its own forward (buffers: BatchNorm's running
        # statistics) and their tensors' versions, which ``_note_layer_writes`` watches
        self._buffer_watch: list[tuple[torch.Tensor, Blob]] = [
            (tensor, by_tensor[id(tensor)])
            for tensor in self._net.buffers()
            if id(tensor) in by_tensor
        ]
        self._buffer_versions = [tensor._version for tensor, _ in self._buffer_watch]
        self._parameters = tuple(self._net.parameters())
        self._one_pass_cache: tuple[tuple[bool, ...], OnePassPlan | None] | None = None
        self._binds += 1

    def _note_layer_writes(self) -> None:
        """A layer that updates its own blobs in forward (BatchNorm's running statistics in
        TRAIN) writes the module's tensor in place. On the CPU that tensor is the blob's host
        memory; on a GPU the host copy is then stale, as in Caffe, whose layer writes
        mutable_gpu_data: move the head to the device so the next host read copies back, and
        a host edit is not synced over the update. A net the lazy forward serves updates
        nothing in forward (``replayable``): then no buffer is looked at (ResNet-50's 159 took
        30-80 us a forward)."""
        if self._device.type == "cpu" or self._lazy.applies:
            return
        versions = self._buffer_versions
        for k, (tensor, blob) in enumerate(self._buffer_watch):
            if tensor._version != versions[k]:
                versions[k] = tensor._version
                blob.data_memory.head = Head.HEAD_AT_GPU

    def _param_may_change(self, blob: Blob) -> None:
        """A param blob is handed out writable (a numpy view: net surgery). Blobs the lazy
        forward would recompute from the old values are settled now; the next run forgets
        the folds derived from the params (a write through numpy bumps no tensor version),
        and so does the next run of every net sharing params with this one."""
        self._lazy.settle()
        self._follow_conversion(refuse=False)  # ``blob`` is then the module's new memory
        written = (blob, self._param_users[id(blob)])
        self._written_params[id(blob)] = written
        for partner in self._partners:
            partner._written_params[id(blob)] = written

    def _forget_written_params(self) -> None:
        """Before a run: folds derived from params written since the last run are dropped. A
        param whose numpy view someone still holds may be written again through it, so it
        stays on the list (its folds are redone every run) until the view is gone."""
        self._net.params_changed()
        self._written_params = {
            k: (b, bare)
            for k, (b, bare) in self._written_params.items()
            if b.data_memory.cpu_users() > bare
        }

    def _param_blob(self, tensor: torch.Tensor) -> Blob:
        blob = Blob(tuple(tensor.shape), dtype=tensor.dtype)
        flat = tensor.detach().view(-1)
        if isinstance(tensor, nn.Parameter):
            if tensor.grad is None or tensor.grad.shape != tensor.shape:
                tensor.grad = torch.zeros_like(tensor)
            grad = tensor.grad.view(-1)
        else:
            grad = torch.zeros_like(flat)
        if flat.device.type == "cpu":
            blob.data_memory.set_cpu_data(flat)
            blob.diff_memory.set_cpu_data(grad)
        else:
            blob.data_memory.set_gpu_data(flat)
            blob.diff_memory.set_gpu_data(grad)
        return blob

    def _find_backward_refusals(self) -> dict[int, Callable[[], BlobWiringError]]:
        """Layer index -> the error (made fresh per raise) for a layer whose Caffe Backward
        aborts with the flags Net::Init gave it (a loss layer asked for its labels' diff,
        ArgMax under a loss...). Caffe builds and runs forward such a net; its Backward
        aborts at that layer."""
        out: dict[int, Callable[[], BlobWiringError]] = {}
        for i, step in enumerate(self._net.steps):
            module = self._net.module_of(step)
            if not step.need_backward or step.is_input or not isinstance(module, CaffeLayer):
                continue
            why = module.backward_refusal(step.bottom_need_backward, step.bottoms)
            if why:
                out[i] = functools.partial(
                    BlobWiringError,
                    why,
                    layer=step.name,
                    layer_type=step.type,
                    hint="Caffe aborts there too; keep the layer off the backward path: "
                    "propagate_down: false on the bottom that reads its top, no force_backward"
                    if module.backward_aborts
                    else "Caffe aborts there too; give that bottom propagate_down: false, or "
                    "keep learnable layers (and force_backward) from feeding it",
                )
        return out

    def _check_backward_allowed(self, start: int, end: int) -> None:
        """Caffe's Backward from ``start`` down to ``end`` aborts at the first refusing layer."""
        for i in range(start, end - 1, -1):
            if i in self._refusals:
                raise self._refusals[i]()

    def _find_split_sources(self) -> dict[str, str]:
        """Split top -> the blob whose data it is. Caffe's SplitLayer shares its bottom's data
        with every top, so Backward reading a split top reads the bottom blob as it is now."""
        writers: dict[str, int] = {}
        for step in self._net.steps:
            for t in step.tops:
                writers[t] = writers.get(t, 0) + 1
        source: dict[str, str] = {}
        for step in self._net.steps:
            if step.type == "Split" and len(step.bottoms) == 1:
                root = source.get(step.bottoms[0], step.bottoms[0])
                for t in step.tops:
                    if writers[t] == 1 and t != step.bottoms[0]:
                        source[t] = root
        return source

    # -- pycaffe attributes -----------------------------------------------------------------
    @property
    def module(self) -> TorchNet:
        """The compiled torch module this Caffe-face net drives."""
        return self._net

    @property
    def params(self) -> OrderedDict[str, list[Blob]]:
        return OrderedDict((lv.name, lv.blobs) for lv in self._layer_views if lv.blobs)

    @property
    def layer_dict(self) -> OrderedDict[str, Any]:
        return OrderedDict((lv.name, layer) for lv, layer in zip(self._layer_views, self.layers))

    @property
    def _layer_names(self) -> list[str]:
        return self._net.layer_names

    @property
    def _blob_names(self) -> list[str]:
        return list(self._pycaffe_names)

    @property
    def inputs(self) -> list[str]:
        return list(self._net.input_names)

    @property
    def outputs(self) -> list[str]:
        return list(self._net.output_names)

    @property
    def name(self) -> str:
        return self.__dict__.get("_script_name", self._net.name)

    @name.setter
    def name(self, value: str) -> None:
        """pycaffe's Net has no ``name`` property, so ``net.name = ...`` (py-faster-rcnn's
        test_net.py, rpn_generate.py, train_svms.py) is a plain Python attribute: the net's
        own name (what ``save`` writes) stays the prototxt's."""
        self.__dict__["_script_name"] = value

    @property
    def phase(self) -> int:
        return self._net.phase

    @property
    def blob_loss_weights(self) -> OrderedDict[str, float]:
        return OrderedDict(zip(self._blob_names, self._blob_loss_weights))

    @property
    def top_names(self) -> OrderedDict[str, list[str]]:
        return self._names_by_id(self._top_ids)

    @property
    def bottom_names(self) -> OrderedDict[str, list[str]]:
        return self._names_by_id(self._bottom_ids)

    def _names_by_id(self, ids: Callable[[int], list[int]]) -> OrderedDict[str, list[str]]:
        """pycaffe maps blob ids through ``list(net.blobs)``, whose keys are one short per
        repeated "(automatic)": past a second automatic top the names shift (or run out)."""
        names = list(self.blobs)
        return OrderedDict(
            (s.name, [names[j] for j in ids(i)]) for i, s in enumerate(self._net.steps)
        )

    def _top_ids(self, i: int) -> list[int]:
        return [self._blob_index[t] for t in self._net.steps[i].tops]

    def _bottom_ids(self, i: int) -> list[int]:
        return [self._blob_index[b] for b in self._net.steps[i].bottoms]

    @functools.cached_property
    def _blob_index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self._blob_of)}

    # -- devices ----------------------------------------------------------------------------
    def _follow_conversion(self, refuse: bool = True) -> None:
        """Bind the param blobs again after a script converted the module itself
        (``net.module.double().float()``, ``.to(...)``, ``share_memory()``): its params got
        new memory, which net surgery through ``net.params`` would no longer reach (a
        channels_last param is made contiguous again: a Blob is a flat view). pycaffe
        computes in float32 alone: a module left in another dtype is refused (``refuse``)
        here, by name, rather than by torch inside the first layer."""
        if self._net.conversions == self._conversions:
            return
        tensors = [*self._net.parameters(), *self._net.buffers()]
        dtype = next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)
        if dtype != torch.float32:
            if not refuse:
                return
            raise UsageError(
                f"caffe.Net computes in float32, as pycaffe does; its module is now {dtype}",
                path=self._net.path,
                hint="convert it back (net.module.float()), or call the module itself: "
                f"net.module(data=torch.from_numpy(x).to({dtype}))",
            )
        if not all(t.is_contiguous() for t in tensors):  # ``.to(memory_format=...)``
            self._net._apply(torch.Tensor.contiguous)  # a param blob is a flat view
        self._bind_params()
        self._conversions = self._net.conversions

    def _ensure_device(self) -> torch.device:
        if self._net.layer_changes != self._layer_changes:
            raise UsageError(
                "a module was put in the torch net's layers (net.module.layers) after this "
                "Caffe-face Net was built; its blobs and params follow the layers it was "
                "built from",
                path=self._net.path,
                hint="build a new caffe.Net, or run the torch face (net.module) alone",
            )
        self._follow_conversion()
        if self._shares_stale:
            self._share_blobs()
        if self._written_params:
            self._forget_written_params()
        device = runtime.compute_device()
        if device != self._device:
            self._lazy.settle()
            for blob in self._param_blob_of.values():
                blob.data_at(self._device)  # make the module side current before moving
                blob.diff_at(self._device)
            self._net.to(device)
            self._device = device
            self._bind_params()
            self._conversions = self._net.conversions
        if self._shared and any(
            put.data_ptr() != source.data_ptr() for put, source, _ in self._shared.values()
        ):
            self._follow_shares()
        # pull edits on the other side to the module's; a param blob whose head is on the
        # module's side (or SYNCED) is current there: its buffer is the module's tensor.
        # Synced through the flat buffers: no per-blob view is made (see SyncedMemory.take).
        on_cpu = device.type == "cpu"
        count = _params_stale_count(on_cpu)
        if self._params_synced_at == count:
            return device  # no param's module side can have gone stale since
        blobs = self._param_blob_of.values()
        if not on_cpu:
            watch_memories(blobs)
        stale = Head.HEAD_AT_GPU if on_cpu else Head.HEAD_AT_CPU
        sync = SyncedMemory.cpu_data if on_cpu else SyncedMemory.gpu_data
        for memory in memories_at(blobs, stale):
            sync(memory)
        self._params_synced_at = count
        return device

    def _params_written_on_device(self, diff: bool = False) -> None:
        """Module tensors were written directly (weights loaded; with ``diff``, a solver
        update that also rewrote the grads): their side is current."""
        side = Head.HEAD_AT_CPU if self._device.type == "cpu" else Head.HEAD_AT_GPU
        for blob in self._param_blob_of.values():
            blob.data_memory.head = side
            if diff:
                blob.diff_memory.head = side

    # -- forward / backward -----------------------------------------------------------------
    def _constant_dummy_tops(self) -> dict[str, dict[int, str]]:
        """The DummyData tops Caffe fills once, at setup (constant fillers): layer -> {top
        index: blob}. Their blobs get the constant now; a forward then hands the layer what
        they hold (``_holding_tops``), so a value a script writes there stays."""
        held: dict[str, dict[int, str]] = {}
        for step in self._net.steps:
            module = self._net.module_of(step)
            if isinstance(module, DummyDataLayer) and module.constant:
                tops = {i: step.tops[i] for i in module.constant}
                for i, name in tops.items():
                    self._blob_of[name].data[...] = module.constant[i].numpy()
                held[step.name] = tops
        return held

    def _holding_tops(self) -> contextlib.AbstractContextManager[None]:
        """Within: constant DummyData layers return their blobs' current data (see above)."""
        if not self._held_tops:
            return contextlib.nullcontext()
        device = self._device
        return holding_tops(
            {
                layer: {i: self._blob_of[name].data_at(device) for i, name in tops.items()}
                for layer, tops in self._held_tops.items()
            }
        )

    @_compute_method
    def _forward(self, start: int, end: int, observe: Sequence[str] = ()) -> float:
        """Run layers ``start..end``; ``observe``: blobs the caller reads right after. With
        per-layer callbacks (``before_forward``, ``after_forward``) or ``debug_info``, layer by
        layer."""
        self._check_range("_forward", start, end)
        before, after = self._callbacks["before_forward"], self._callbacks["after_forward"]
        debug = self._debug_info
        with self._holding_tops():
            if not before and not after and not debug:
                return self._forward_range(start, end, observe)
            loss = 0.0
            for i in range(start, end + 1):
                for run in before:
                    run(i)
                loss += self._forward_range(i, i, observe)
                if debug:
                    debug_info.log_forward(self, i)
                for run in after:
                    run(i)
            return loss

    def _check_range(self, method: str, start: int, end: int) -> None:
        """Caffe CHECKs that a pass's lower layer index is >= 0 and its higher one below the
        layer count; a negative index must not wrap to a layer at the end, as Python's would."""
        count = len(self._net.steps)
        low, high = (start, end) if method == "_forward" else (end, start)
        if low < 0 or high >= count:
            raise LayerIndexError(
                f"{method} layer index out of range",
                expected=f"0 <= index < {count}",
                got={"start": start, "end": end},
            )

    def before_forward(self, run: Callable[[int], Any]) -> None:
        """pycaffe's Net.before_forward: ``run(i)`` before layer ``i``'s Forward, every
        forward after (forwards then run layer by layer)."""
        self._callbacks["before_forward"].append(run)

    def after_forward(self, run: Callable[[int], Any]) -> None:
        """pycaffe's Net.after_forward: ``run(i)`` after layer ``i``'s Forward."""
        self._callbacks["after_forward"].append(run)

    def before_backward(self, run: Callable[[int], Any]) -> None:
        """pycaffe's Net.before_backward: ``run(i)`` before layer ``i``'s Backward (every
        layer in the range, whether it computes a backward or not, as Caffe calls it)."""
        self._callbacks["before_backward"].append(run)

    def after_backward(self, run: Callable[[int], Any]) -> None:
        """pycaffe's Net.after_backward: ``run(i)`` after layer ``i``'s Backward."""
        self._callbacks["after_backward"].append(run)

    def _forward_range(self, start: int, end: int, observe: Sequence[str]) -> float:
        steps = self._net.steps
        backward = self._backward_steps
        first = bisect.bisect_left(backward, start)  # the first at or after ``start``
        if first == len(backward) or backward[first] > end:
            return self._forward_inference(start, end, observe)
        device = self._ensure_device()
        self._check_input_shapes()
        for i in range(start, end + 1):
            self._records.pop(i, None)
        loss = 0.0
        for i in range(start, end + 1):
            step = steps[i]
            if step.is_input:
                continue
            bottoms = []
            for j, name in enumerate(step.bottoms):
                t = self._blob_of[self._data_source.get(name, name)].data_at(device)
                t = t.clone() if self._overwritten[i][j] else t.detach()
                if step.need_backward and step.bottom_need_backward[j] and t.is_floating_point():
                    t.requires_grad_(True)
                bottoms.append(t)
            with torch.set_grad_enabled(step.need_backward):
                tops = self._net.run_step(step, bottoms)
            for name, t, w in zip(step.tops, tops, step.loss_weights):
                blob = self._blob_of[name]
                if blob.shape != tuple(t.shape):
                    self._reshape_blob(name, tuple(t.shape))
                if not self._holds_shared(i, name):
                    blob.data_to_overwrite(device).copy_(t.detach())
                if w:
                    loss += w * float(t.detach().sum())
            if step.need_backward:
                self._record(i, bottoms, tops)
        return loss

    def _holds_shared(self, i: int, top: str) -> bool:
        """Is layer ``i``'s ``top`` its bottom's memory, which holds its values already?"""
        bottom = self._memory.shared_writes.get((i, top))
        return bottom is not None and (
            self._blob_of[bottom].data_memory is self._blob_of[top].data_memory
        )

    def _check_input_shapes(self) -> None:
        """Once per new input blob shapes, infer the net's shapes (Caffe's per-layer Reshape),
        so a layer that cannot take them (an Eltwise of two sizes after ``blobs['data']
        .reshape``) is a located error before any layer runs, not a torch RuntimeError."""
        shapes = {n: self._blob_of[n].shape for n in self._net.input_names}
        if shapes != self._checked_input_shapes:
            self._net.infer_shapes(shapes)
            self._checked_input_shapes = shapes

    def _record(self, i: int, bottoms: list[torch.Tensor], tops: tuple[torch.Tensor, ...]) -> None:
        """Keep layer ``i``'s forward graph for a later ``backward()`` (as Caffe keeps each
        layer's forward state, e.g. Dropout's mask)."""
        self._records[i] = _Record(bottoms, tops)

    def _note_forward_data(self, start: int, end: int) -> None:
        """After a public ``forward()``: remember what each bottom a recorded layer's Caffe
        Backward reads held, so a later ``backward()`` can tell a script's edits from it. The
        last writer's top tensor (kept alive by its record) serves without a copy; other blobs
        are cloned. A bottom an in-place layer overwrote after the layer read it is compared
        with what the layer read (its record's clone), so Backward replays on the blob as Caffe
        reads it. Layers whose backward rule recomputes a forward buffer (``keeps_forward_bottom``)
        keep theirs the same way. (``forward_backward`` skips this: nothing can edit in
        between.)"""
        device = self._device
        steps = self._net.steps
        overwritten = self._overwritten
        last_top: dict[str, tuple[torch.Tensor, _Record]] = {}
        for i in range(start, end + 1):
            record = self._records.get(i)
            for k, name in enumerate(steps[i].tops):
                if record is None:
                    last_top.pop(name, None)
                else:
                    last_top[name] = (record.tops[k].detach(), record)
        kept: dict[str, torch.Tensor] = {}
        for i in range(start, end + 1):
            record = self._records.get(i)
            if record is None or not (
                reads_bottom_data(steps[i]) or keeps_forward_bottom(self._net.module_of(steps[i]))
            ):
                continue
            module = self._net.module_of(steps[i])
            if not slope_kept_when_overwritten(steps[i], module, i in self._relu_masks_moved):
                # a bottom that an in-place layer overwrote after this layer read it: Caffe's
                # Backward reads the overwritten blob, so compare with what this forward read
                read = [b.detach() if o else None for b, o in zip(record.bottoms, overwritten[i])]
            else:
                read = [None] * len(record.bottoms)
            for name, before in zip(steps[i].bottoms, read):
                if before is not None or name in kept:
                    continue
                if name not in last_top:
                    kept[name] = self._blob_of[name].data_at(device).clone()
                    continue
                t, writer = last_top[name]
                # a top that is a view of its bottom (Split, Reshape) would move with edits
                # to that blob: keep a copy
                ptr = t.untyped_storage().data_ptr()
                if any(b.untyped_storage().data_ptr() == ptr for b in writer.bottoms):
                    t = t.clone()
                kept[name] = t
            record.seen = [
                kept[name] if before is None else before
                for name, before in zip(steps[i].bottoms, read)
            ]

    def _bottoms_edited(
        self, i: int, device: torch.device, cache: dict[tuple[str, int], bool]
    ) -> bool:
        """Do layer ``i``'s bottoms (a split top: the blob it shares data with, as in Caffe)
        hold other data than its forward read? (``cache``: one comparison per blob and
        forward-time value in a backward pass.)"""
        seen = self._records[i].seen
        if seen is None:
            return True
        for bottom, before in zip(self._net.steps[i].bottoms, seen):
            name = self._data_source.get(bottom, bottom)
            key = (name, id(before))
            if key not in cache:
                now = self._current_data(name, device)
                cache[key] = not (
                    before.shape == now.shape and torch.equal(now, before.to(now.dtype))
                )
            if cache[key]:
                return True
        return False

    def _forward_inference(self, start: int, end: int, observe: Sequence[str] = ()) -> float:
        """Forward when no layer in ``start..end`` needs backward: no autograd, no clones.

        A whole-net run of a net of pure layers takes the torch face's program (LazyForward:
        blobs are written when read), unless a script holds a numpy view of a param: a write
        through it reaches no ``settle``, so a blob left out would be recomputed later with
        the new values. Other whole-net runs take the inference program (net/passes) with
        every blob observable, so only in-place chains fold (their one blob ends with the
        value Caffe leaves there). Each top is copied once into its Blob, whose numpy views
        stay valid.
        """
        device = self._ensure_device()
        net = self._net
        if self._records:
            for i in range(start, end + 1):
                self._records.pop(i, None)
        whole = start == 0 and end == len(net.steps) - 1 and not self._stale_alias_reads
        passes = net.optimize and not net.layers_hooked()  # hooks see their layers' calls
        if whole and passes and self._lazy.applies and not self._written_params:
            return self._lazy.forward(device, observe, self._reshape_blob)
        # no_grad, not inference_mode: a Blob reshaped here must stay writable by later
        # autograd-recording forwards (inference tensors refuse in-place updates outside).
        with torch.no_grad():
            if whole and passes:
                program = net.optimized_program(self._blob_of, device)
                values = {n: self._blob_of[n].data_at(device) for n in net.input_names}
                produced = net.run(values, program=program)
                keys = self._lazy.keys
                for name in self._blob_of:
                    if name in produced and name in self._layer_tops:
                        if keys.get(name, name) == name:
                            self._store_top(name, produced[name], device)
                        elif self._blob_of[name].shape != tuple(produced[name].shape):
                            # its memory is another blob's, which takes the final value
                            self._reshape_blob(name, tuple(produced[name].shape))
            else:
                for i in range(start, end + 1):
                    step = net.steps[i]
                    if step.is_input:
                        continue
                    # a split top reads its bottom blob, whose data it shares in Caffe
                    # (an edit of that blob reaches a forward started past the split)
                    source = self._data_source
                    bottoms = [
                        self._blob_of[source.get(b, b)].data_at(device) for b in step.bottoms
                    ]
                    for name, t in zip(step.tops, net.run_step(step, bottoms)):
                        if self._blob_of[name].shape != tuple(t.shape):
                            self._reshape_blob(name, tuple(t.shape))
                        if not self._holds_shared(i, name):
                            self._store_top(name, t, device)
            loss = 0.0
            for i in range(start, end + 1):
                for name, w in zip(net.steps[i].tops, net.steps[i].loss_weights):
                    if w:
                        loss += w * float(self._blob_of[name].data_at(device).sum())
        return loss

    def _reshape_blob(self, name: str, shape: tuple[int, ...]) -> None:
        """Reshape a blob a forward writes (sharing memory again where Caffe's layers do); a
        loss top's diff is its loss weight again."""
        blob = self._blob_of[name]
        blob.reshape(shape)
        if self._shares_stale:
            self._share_blobs()
        if self._blob_loss_weights[name]:
            blob.diff[...] = self._blob_loss_weights[name]

    def _store_top(
        self, name: str, t: torch.Tensor, device: torch.device, adopt: bool = False
    ) -> None:
        """Copy a computed top into its Blob (reshaping it, and its loss diff, when needed).
        ``adopt``: ``t`` is a fresh output no one else holds; the Blob may take it as is."""
        blob = self._blob_of[name]
        if blob.shape != tuple(t.shape):
            self._reshape_blob(name, tuple(t.shape))
        if adopt:
            blob.take_data(t)  # replaces a deferred value too
            return
        dest = blob.data_to_overwrite(device)
        if dest.data_ptr() != t.data_ptr() or dest.stride() != t.stride():
            dest.copy_(t)

    @_compute_method
    def _backward(self, start: int, end: int, check_edits: bool = True) -> None:
        self._check_range("_backward", start, end)
        if self._refusals:
            self._check_backward_allowed(start, end)
        device = self._ensure_device()
        edited: dict[tuple[str, int], bool] = {}
        before, after = self._callbacks["before_backward"], self._callbacks["after_backward"]
        debug = self._debug_info
        for i in range(start, end - 1, -1):
            for run in before:  # Caffe's Net callbacks see every layer, backward or not
                run(i)
            self._backward_layer(i, device, check_edits, edited)
            if debug and self._net.steps[i].need_backward:
                debug_info.log_backward(self, i)
            for run in after:
                run(i)

    def _backward_layer(
        self,
        i: int,
        device: torch.device,
        check_edits: bool,
        edited: dict[tuple[str, int], bool],
    ) -> None:
        """Layer ``i``'s Backward: its bottom diffs written, its param diffs added to."""
        step = self._net.steps[i]
        if not step.need_backward or step.is_input:
            return
        module = self._net.module_of(step)
        if not module.has_backward:
            return
        if step.type == "Parameter":
            self._parameter_shares_diff(i, module, device)
            return
        if self._shares_diff(i):  # Flatten, Reshape: the bottom's diff is the top's
            return
        if step.type == "Silence":  # SilenceLayer::Backward zeroes each bottom's diff
            for j, name in enumerate(step.bottoms):
                if step.bottom_need_backward[j]:
                    self._blob_of[name].diff_to_overwrite(device).zero_()
            return
        record = self._records.get(i)
        if getattr(module, "in_place_slope", False):
            # in place, Caffe's Backward takes its slope at the shared blob as it is now
            self._backward_from_top(i, _slope_rule(module), device)
            return
        # from the top blob after an edit, or after a later in-place layer wrote it
        if record is not None and (check_edits or self._top_rewritten[i]):
            source = self._data_source.get(step.bottoms[0], step.bottoms[0])
            read = record.seen or record.bottoms  # seen: a copy a script's edit leaves alone
            rule = top_data_rule(step, module, read, lambda: self._current_data(source, device))
            if rule is not None:
                self._backward_from_top(i, rule, device)
                return
        reads = reads_bottom_data(step)
        if (
            record is None
            or (reads and record.bottoms_rewritten())
            or i in self._relu_masks_moved
            or (check_edits and reads and self._bottoms_edited(i, device, edited))
        ):  # no forward since, a later forward wrote a bottom's memory (a forward over an
            # earlier range), a later in-place layer rewrote an in-place ReLU's mask, or a
            # script wrote a bottom this layer's Backward reads
            record = self._replay(i, device)
        outs, grads = [], []
        for name, t in zip(step.tops, record.tops):
            if t.requires_grad:
                outs.append(t)
                grads.append(self._blob_of[name].diff_at(device).view(t.shape).to(t.dtype))
        wanted = [
            j
            for j, b in enumerate(record.bottoms)
            if step.bottom_need_backward[j] and b.requires_grad
        ]
        params = [
            p
            for p, need in zip(module.param_blobs(), step.param_need_backward)
            if need and isinstance(p, nn.Parameter) and p.requires_grad
        ]
        inputs = [record.bottoms[j] for j in wanted] + params
        if not outs or not inputs:
            return
        got = torch.autograd.grad(outs, inputs, grads, allow_unused=True, retain_graph=True)
        for j, g in zip(wanted, got[: len(wanted)]):
            diff = self._blob_of[step.bottoms[j]].diff_to_overwrite(device)
            if g is None:
                diff.zero_()
            else:
                diff.copy_(g.view(diff.shape))
        for p, g in zip(params, got[len(wanted) :]):
            if g is not None:
                self._param_blob_of[id(p)].diff_at(device, mutable=True).add_(g.view(p.shape))

    def _shares_diff(self, i: int) -> bool:
        """Is layer ``i``'s one top's diff its bottom's memory (``MemoryShares``)?"""
        step = self._net.steps[i]
        if len(step.tops) != 1 or (i, step.tops[0]) not in self._memory.shared_writes:
            return False
        top, bottom = self._blob_of[step.tops[0]], self._blob_of[step.bottoms[0]]
        return step.type != "Split" and top.diff_memory is bottom.diff_memory

    def _parameter_shares_diff(self, i: int, module: CaffeLayer, device: torch.device) -> None:
        """Caffe's ParameterLayer shares its param's diff with its top, so after Backward the
        param diff is the top diff its consumers wrote (overwritten, not added to)."""
        (param,) = module.param_blobs()
        top = self._blob_of[self._net.steps[i].tops[0]].diff_at(device)
        self._param_blob_of[id(param)].diff_to_overwrite(device).copy_(top.view(param.shape))

    def _replay(self, i: int, device: torch.device) -> _Record:
        """Layer ``i``'s forward recomputed from its bottoms' current data, for a backward
        with no forward record (Caffe's Backward reads the blobs as they are now). The top
        blobs are left as they are."""
        step = self._net.steps[i]
        bottoms = []
        for j, name in enumerate(step.bottoms):
            t = self._current_data(self._data_source.get(name, name), device).clone()
            if step.bottom_need_backward[j] and t.is_floating_point():
                t.requires_grad_(True)
            bottoms.append(t)
        keep = getattr(self._net.module_of(step), "state_kept", contextlib.nullcontext)
        with torch.enable_grad(), keep():  # a recurrent layer's state is not moved by it
            tops = self._net.run_step(step, bottoms)
        return _Record(bottoms, tops)

    def _backward_from_top(self, i: int, rule: Any, device: torch.device) -> None:
        """Caffe's Backward for a layer that reads only its top: from the top blob now."""
        step = self._net.steps[i]
        if not step.bottom_need_backward[0]:
            return
        top = self._current_data(step.tops[0], device)
        grad = rule(top, self._blob_of[step.tops[0]].diff_at(device))
        diff = self._blob_of[step.bottoms[0]].diff_to_overwrite(device)
        diff.copy_(grad.reshape(diff.shape))  # MVN's top is 4-D whatever its bottom's axes

    def _current_data(self, name: str, device: torch.device) -> torch.Tensor:
        """Blob ``name``'s data now, on ``device``. A newer host side is copied out rather than
        synced into the device buffer in place: that would bump the autograd version of the
        tensors the forward's graph saved from it, and other layers' backward would refuse."""
        blob = self._blob_of[name]
        if device.type != "cpu" and blob.data_memory.head is Head.HEAD_AT_CPU:
            return blob.cpu_data().to(device)
        return blob.data_at(device)

    def _layer_index(self, name: str) -> int:
        try:
            return self._net.layer_names.index(name)
        except ValueError:
            self._net.step(name)  # raises with close matches
            raise

    def forward(
        self,
        blobs: Sequence[str] | None = None,
        start: str | None = None,
        end: str | None = None,
        **kwargs: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """pycaffe's forward: set ``kwargs`` inputs, run ``start..end``, return outputs."""
        blobs = self._known_blobs(blobs, "blobs")
        start_ind = 0 if start is None else self._layer_index(start)
        if end is None:
            end_ind = len(self._net.steps) - 1
            outputs = set(self.outputs + blobs)
        else:
            end_ind = self._layer_index(end)
            outputs = set(self.top_names[self._net.layer_names[end_ind]] + blobs)
        if kwargs:
            self._assign_batch(
                kwargs,
                self.inputs,
                "data",
                "Input blob arguments do not match net inputs.",
                "Input is not batch sized",
            )
        self._forward(start_ind, end_ind, sorted(self._own_name.get(n, n) for n in outputs))
        if self._records:
            self._note_forward_data(start_ind, end_ind)
        return {name: self.blobs[name].data for name in outputs}

    def backward(
        self,
        diffs: Sequence[str] | None = None,
        start: str | None = None,
        end: str | None = None,
        **kwargs: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """pycaffe's backward: set ``kwargs`` top diffs, run ``start..end`` in reverse."""
        diffs = self._known_blobs(diffs, "diffs")
        start_ind = len(self._net.steps) - 1 if start is None else self._layer_index(start)
        if end is None:
            end_ind = 0
            outputs = set(self.inputs + diffs)
        else:
            end_ind = self._layer_index(end)
            outputs = set(self.bottom_names[self._net.layer_names[end_ind]] + diffs)
        if kwargs:
            self._assign_batch(
                kwargs,
                self.outputs,
                "diff",
                "Top diff arguments do not match net outputs.",
                "Diff is not batch sized",
            )
        self._backward(start_ind, end_ind)
        return {name: self.blobs[name].diff for name in outputs}

    def _known_blobs(self, names: Sequence[str] | None, argument: str) -> list[str]:
        """``names`` as a list, each a blob of the net (pycaffe's lookup after the pass
        raises a KeyError, which UnknownNameError also is; here before the pass runs)."""
        names = list(names or [])
        for name in names:
            if name not in self.blobs:
                raise UnknownNameError(
                    f"{argument}=[...] names no blob of the net: {name!r}",
                    path=self._net.path,
                    expected="names in net.blobs",
                )
        return names

    def _assign_batch(
        self,
        values: Mapping[str, Any],
        names: Sequence[str],
        field: str,
        mismatch: str,
        not_batch: str,
    ) -> None:
        """Write ``values`` into blob ``field`` ("data" or "diff"); the keyword arguments of
        forward/backward must name exactly ``names``, each a full batch. The messages begin
        with pycaffe's own, which scripts may match."""
        if set(values) != set(names):
            raise BlobWiringError(mismatch, expected=sorted(names), got=sorted(values))
        for name, value in values.items():
            array = np.asarray(value)
            blob = self._blob_of[name]
            if array.shape[0] != blob.shape[0]:
                raise BlobWiringError(
                    f"{not_batch} (blob {name!r})",
                    expected=blob.shape[0],
                    got=array.shape[0],
                )
            getattr(blob, field)[...] = array

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        """pycaffe: feed the first layer, a MemoryData layer, with ``data`` and ``labels``
        (a 1-D label array is reshaped to N x 1 x 1 x 1, as pycaffe's wrapper does)."""
        if isinstance(labels, np.ndarray) and labels.ndim == 1:
            labels = np.ascontiguousarray(labels[:, np.newaxis, np.newaxis, np.newaxis])
        self._set_input_arrays(data, labels)

    def _set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        """pycaffe's binding: both arrays 4-D, C-contiguous float32 (the layer serves them in
        place, as MemoryDataLayer::Reset keeps the pointer); a RuntimeError otherwise."""
        from ..ops.memory_data import MemoryDataLayer

        first = self._net.module_of(self._net.steps[0]) if self._net.steps else None
        if not isinstance(first, MemoryDataLayer):
            raise InputArrayError(
                "set_input_arrays may only be called if the first layer is a MemoryData layer",
                expected="MemoryData",
                got=self._net.steps[0].type if self._net.steps else "no layers",
            )
        first.check_array(data, "data array", first.dims)
        first.check_array(labels, "labels array", (1, 1, 1))
        first.reset(data, labels)

    @_compute_method
    def forward_backward(self) -> float:
        """Caffe's Net::ForwardBackward: forward, then backward; returns the loss. Nothing can
        edit a blob in between, so where exact this is one autograd pass (one_pass.py), unless
        per-layer callbacks or ``debug_info`` must see each layer."""
        if self._refusals:
            self._check_backward_allowed(len(self._net.steps) - 1, 0)
        plan = None if self._layer_by_layer() else self._one_pass_plan()
        if plan is not None:
            with self._holding_tops():
                return forward_backward_one_pass(self, plan)
        loss = self._forward(0, len(self._net.steps) - 1)
        self._backward(len(self._net.steps) - 1, 0, check_edits=False)
        if self._debug_info:  # Net::Backward's closing line
            debug_info.log_param_norms(self)
        return loss

    def _layer_by_layer(self) -> bool:
        """Must passes run layer by layer (per-layer callbacks, debug_info, a read through
        a memory another blob's layer wrote: ``MemoryShares.stale_alias_reads``)?"""
        return self._debug_info or any(self._callbacks.values()) or self._stale_alias_reads

    @_compute_method
    def _clear_and_forward_backward(self) -> float:
        """ClearParamDiffs then ForwardBackward (a solver iteration of one pass); on the one
        pass each param diff is written once instead of zeroed and then added to."""
        if self._refusals:
            self._check_backward_allowed(len(self._net.steps) - 1, 0)
        plan = None if self._layer_by_layer() else self._one_pass_plan()
        if plan is None:
            self.clear_param_diffs()
            return self.forward_backward()
        with self._holding_tops():
            return forward_backward_one_pass(self, plan, clear=True)

    def _one_pass_plan(self) -> OnePassPlan | None:
        """``plan_one_pass`` for the params as bound now (kept until they change)."""
        flags = tuple(p.requires_grad for p in self._parameters)
        if self._one_pass_cache is None or self._one_pass_cache[0] != flags:
            self._one_pass_cache = (flags, plan_one_pass(self))
        return self._one_pass_cache[1]

    def forward_all(
        self, blobs: Sequence[str] | None = None, **kwargs: np.ndarray
    ) -> dict[str, np.ndarray]:
        """Run batches of ``kwargs`` inputs through the net; concatenate the outputs."""
        return forward_in_batches(self, blobs, kwargs)

    def forward_backward_all(
        self, blobs: Sequence[str] | None = None, diffs: Sequence[str] | None = None, **kwargs: Any
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """pycaffe's forward_backward_all: batches of the inputs (and of output diffs) in
        ``kwargs`` forward then backward; (outputs and ``blobs``, input and ``diffs`` diffs),
        each concatenated over the batches, the last batch's padding dropped."""
        outs: dict[str, list[np.ndarray]] = {n: [] for n in {*self.outputs, *(blobs or ())}}
        grads: dict[str, list[np.ndarray]] = {n: [] for n in {*self.inputs, *(diffs or ())}}
        forward = list(self._batch({n: kwargs[n] for n in self.inputs if n in kwargs}))
        backward = list(self._batch({n: kwargs[n] for n in self.outputs if n in kwargs}))
        per_batch: set[str] = set()  # values without a batch axis (a loss): one per batch
        for i in range(max(len(forward), len(backward))):
            top = self.forward(blobs=blobs, **(forward[i] if i < len(forward) else {}))
            bottom = self.backward(diffs=diffs, **(backward[i] if i < len(backward) else {}))
            for collected, values in ((outs, top), (grads, bottom)):
                for name, value in values.items():
                    if value.ndim:
                        collected[name].extend(value.copy())
                    else:
                        per_batch.add(name)
                        collected[name].append(value.copy())
        given = len(next(iter(kwargs.values()))) if kwargs else None
        return _unpadded(outs, given, per_batch), _unpadded(grads, given, per_batch)

    def _batch(self, arrays: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """pycaffe's Net._batch: ``arrays`` cut into batches of the net's batch size (the
        first blob's first axis), the last one padded with zeros."""
        if not arrays:
            return
        batch = next(iter(self._blob_of.values())).shape[0]
        total = len(next(iter(arrays.values())))
        for first in range(0, total, batch):
            part = {}
            for name, value in arrays.items():
                chunk = np.asarray(value[first : first + batch])
                pad = batch - len(chunk)
                if pad:
                    chunk = np.concatenate([chunk, np.zeros((pad, *chunk.shape[1:]))])
                part[name] = chunk
            yield part

    @property
    def _blobs(self) -> list[Blob]:
        """pycaffe's Net._blobs: the blobs in order."""
        return list(self._blob_of.values())

    @property
    def _inputs(self) -> list[int]:
        """pycaffe's Net._inputs: the input blobs' indices among ``_blob_names``."""
        return [self._blob_index[n] for n in self.inputs]

    @property
    def _outputs(self) -> list[int]:
        """pycaffe's Net._outputs: the output blobs' indices among ``_blob_names``."""
        return [self._blob_index[n] for n in self.outputs]

    def clear_param_diffs(self) -> None:
        for blob in self._param_blob_of.values():
            blob.diff[...] = 0

    def reshape(self) -> None:
        """Re-infer every blob shape from the input blobs' current shapes (Net::Reshape)."""
        shapes = self._net.infer_shapes({n: self._blob_of[n].shape for n in self.inputs})
        for name, shape in shapes.items():
            if self._blob_of[name].shape != tuple(shape):
                self._reshape_blob(name, tuple(shape))

    # -- weights -----------------------------------------------------------------------------
    def copy_from(self, path: str | os.PathLike, strict: bool = False) -> None:
        """Caffe's CopyTrainedLayersFrom (binary or HDF5).

        ``strict``: unfilled param layers are an error, not a warning (see load_weights).
        """
        self._copy_from(path, strict)

    def _copy_from(self, path: str | os.PathLike, strict: bool = False) -> list[str]:
        """``copy_from``, returning the layers filled (a solver's weights list reads them)."""
        self._ensure_device()
        self._lazy.settle()
        filled = load_weights(self._net, path, strict=strict, set_diff=self._set_param_diff)
        self._params_written_on_device()
        return filled

    def _set_param_diff(self, tensor: torch.Tensor, values: np.ndarray) -> None:
        """A diff the caffemodel stores (snapshot_diff) goes into the param blob's diff, as
        Caffe's Blob::FromProto copies it: a later backward accumulates onto it."""
        diff = self._param_blob_of[id(tensor)].diff_to_overwrite(self._device)
        diff.copy_(torch.from_numpy(values).view(diff.shape))

    def load_hdf5(self, path: str | os.PathLike) -> None:
        """pycaffe's load_hdf5 (Caffe's CopyTrainedLayersFromHDF5): weights from an HDF5 file."""
        if not is_hdf5(check_weights_file(path)):
            raise WeightsError("not an HDF5 weights file", path=os.fspath(path))
        self.copy_from(path)

    def save(self, path: str | os.PathLike, write_diff: bool = False) -> None:
        """pycaffe's Net_Save: a binary caffemodel, whatever the file name ends in."""
        self._ensure_device()
        save_weights(self._net, path, write_diff=write_diff, hdf5=False)

    def save_hdf5(self, path: str | os.PathLike, write_diff: bool = False) -> None:
        self._ensure_device()
        save_weights(self._net, path, write_diff=write_diff, hdf5=True)

    def share_with(self, other: Net) -> None:
        """Caffe's ShareTrainedLayersWith: same-named layers use ``other``'s param *data*
        memory (Blob::ShareData); each net keeps its own diffs, so one net's backward does not
        write the other's, and this net's solver updates the data both nets use."""
        self._ensure_device()
        other._ensure_device()
        for net in (self, other):  # updates of one net's params now reach the other unseen
            net._lazy.settle()
            net._lazy.shares_params = True
        self._partners.add(other)
        other._partners.add(self)
        # Caffe walks ``other``'s layers and shares each into the first layer of this net
        # with its name (two layers may share a name: a later source wins, a later target
        # keeps its own params)
        first: dict[str, int] = {}
        for i, step in enumerate(self._net.steps):
            first.setdefault(step.name, i)
        for source in other._net.steps:
            i = first.get(source.name, -1)
            if i < 0:
                continue
            step = self._net.steps[i]
            mine = self._net.module_of(step).param_blobs()
            theirs = other._net.module_of(source).param_blobs()
            if len(theirs) != len(mine):
                raise LayerParamError(
                    "incompatible number of blobs",
                    layer=step.name,
                    layer_type=step.type,
                    expected=len(mine),
                    got=len(theirs),
                )
            for j, (t, s) in enumerate(zip(mine, theirs)):
                if tuple(t.shape) != tuple(s.shape):
                    raise LayerParamError(
                        f"cannot share param {j} weights; shape mismatch",
                        layer=step.name,
                        layer_type=step.type,
                        expected=tuple(t.shape),
                        got=tuple(s.shape),
                    )
                self._shared[(i, j)] = (t, s, other)
        if self._reshare():
            self._bind_params()

    def _reshare(self) -> bool:
        """Point every shared param at its source's memory (again, after a device move took
        either side elsewhere); returns whether any param changed. A Parameter over the
        source's tensor (``detach``: the same memory and version counter, so folds cached on
        either side see the other's in-place updates) with this net's own grad, the diff."""
        made: dict[int, torch.Tensor] = {}  # params this net shares between layers stay one
        changed = False
        for (layer, j), (put, source, _) in self._shared.items():
            if put.data_ptr() == source.data_ptr() or put.device != source.device:
                continue
            module = self._net.module_of(self._net.steps[layer])
            current = module.param_blobs()[j]
            new = made.get(id(current))
            if new is None:
                if isinstance(source, nn.Parameter):
                    new = CaffeParameter(source.detach(), requires_grad=current.requires_grad)
                    if current.grad is not None and current.grad.device == new.device:
                        new.grad = current.grad  # the target keeps its diff
                else:
                    new = source
                made[id(current)] = new
            module.set_param_blob(j, new)
            self._shared[(layer, j)] = (new, source, self._shared[(layer, j)][2])
            changed = True
        return changed

    def _follow_shares(self) -> None:
        """A shared param no longer has its source's memory (a device move): bring the
        source nets to this device, then share again."""
        if self._following_shares:  # nets sharing both ways reach each other once
            return
        self._following_shares = True
        try:
            for other in {id(o): o for _, _, o in self._shared.values()}.values():
                other._ensure_device()
            if self._reshare():
                self._bind_params()
        finally:
            self._following_shares = False

    def __repr__(self) -> str:
        return (
            f"<caffe.Net {self.name!r} phase={caffe_pb2.Phase.Name(self.phase)} "
            f"{len(self.layers)} layers>"
        )


def _parse_net_args(
    args: tuple, weights: Any, phase: Any, level: int, stages: Any
) -> tuple[Any, Any, int, Any]:
    """pycaffe's two constructors: ``(phase, level=0, stages=None, weights=None)``, each
    positional or keyword, and the old ``(weights, phase)``; sort them out."""
    if args and not isinstance(args[0], (str, os.PathLike)):  # (phase, level, stages, weights)
        if phase is not None:
            raise UsageError("caffe.Net got phase twice", got=args)
        if len(args) > 4:
            raise UsageError(
                "caffe.Net takes (network_file, phase, level, stages, weights)",
                expected="at most 5 positional arguments",
                got=len(args) + 1,
            )
        given = dict(zip(("level", "stages", "weights"), args[1:]))
        if "level" in given and level != 0 or "stages" in given and stages is not None:
            raise UsageError("caffe.Net got level/stages twice", got=args)
        if "weights" in given and weights is not None:
            raise UsageError("caffe.Net got weights twice", got=args)
        phase = args[0]
        level = given.get("level", level)
        stages = given.get("stages", stages)
        weights = given.get("weights", weights)
    elif len(args) == 1:
        if weights is None:
            weights = args[0]
        else:
            raise UsageError("caffe.Net got weights twice", got=args)
    elif len(args) == 2:
        if weights is not None or phase is not None:
            raise UsageError("caffe.Net got weights/phase twice", got=args)
        weights, phase = args
    elif len(args) > 2:
        raise UsageError(
            "caffe.Net takes (network_file, [weights], phase)",
            expected="at most 3 positional arguments after weights",
            got=len(args) + 1,
        )
    if phase is None:
        raise UsageError("caffe.Net needs a phase", expected="caffe.TRAIN or caffe.TEST", got=None)
    return weights, phase, level, stages


def _unpadded(
    collected: Mapping[str, list[np.ndarray]], given: int | None, per_batch: set[str]
) -> dict[str, np.ndarray]:
    """Each list as one array, the batched ones cut to the ``given`` number of items (the
    last batch's padding dropped)."""
    return {
        name: np.asarray(values if given is None or name in per_batch else values[:given])
        for name, values in collected.items()
    }


def forward_in_batches(
    net: Net, blobs: Sequence[str] | None, kwargs: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """pycaffe's forward_all: split inputs into net-sized batches, pad the last one.

    Blobs without a batch axis (a scalar loss) come back as one value per forward, where
    pycaffe itself would fail to concatenate them.
    """
    per_batch: set[str] = set()
    outputs = list(net.outputs) + list(blobs or [])
    results: dict[str, list[np.ndarray]] = {name: [] for name in outputs}
    inputs = {k: np.asarray(v) for k, v in kwargs.items()}
    if not inputs:
        out = net.forward(blobs=blobs)
        return {k: v.copy() for k, v in out.items()}
    sizes = {len(v) for v in inputs.values()}
    if len(sizes) != 1:
        raise BlobWiringError(
            "forward_all inputs have different batch counts",
            got={k: len(v) for k, v in inputs.items()},
        )
    total = sizes.pop()
    batch = net.blobs[net.inputs[0]].shape[0]
    for first in range(0, total, batch):
        chunk: dict[str, Any] = {}
        for name, value in inputs.items():
            part = value[first : first + batch]
            pad = batch - len(part)
            if pad:
                part = np.concatenate([part, np.zeros((pad,) + part.shape[1:], part.dtype)])
            chunk[name] = part
        out = net.forward(blobs=blobs, **chunk)
        for name in outputs:
            value = out[name].copy()
            if value.ndim and value.shape[0] == batch:
                results[name].extend(value)
            else:  # a per-batch value (a scalar loss): one entry per forward
                per_batch.add(name)
                results[name].append(value)
    return {name: np.asarray(v if name in per_batch else v[:total]) for name, v in results.items()}
