"""Net: a compiled Caffe net as an ordinary ``torch.nn.Module`` (the torch face).

It holds the layer modules (``self.layers``, keyed by a sanitized name) and a static program
of LayerSteps that ``forward`` runs over a dict of named blobs. ``net(data=x)`` returns the
output blobs as a dict; ``state_dict``, ``.to()``, autograd and torch optimizers work as for
any module. The Caffe face (``torchcaffe.pycaffe.Net``) drives the same program layer by layer.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from ..errors import (
    BlobWiringError,
    LayerParamError,
    TorchCaffeError,
    UnknownLayerError,
    UnsupportedError,
    UsageError,
)
from ..ops import fused_relu, fused_steps, hook_watch, mode_watch
from ..ops._narrow import is_narrow
from ..ops._transforms import under_func_transform
from ..ops.base import CaffeLayer, Shape, any_requires_grad, module_slots
from ..precision import caffe_float32, caffe_float32_backward, on_cuda
from ..proto import caffe_pb2
from .builder import build_net, set_requires_grad
from .feeds import SOURCE_LAYER_TYPES
from .finite import FiniteParams
from .layer_dict import LayerDict
from .own_forward import architecture, base_class, new_instance, with_own_forward
from .passes import (
    OptimizedProgram,
    optimize_for_inference,
    optimize_for_training,
    to_nchw,
)
from .program import LayerStep, ParamInfo
from .state import make_state, stage_list
from .untraced_build import build_untraced, dynamo_is_tracing, new_token

PathLike = str | os.PathLike
# (observable blobs, net.training, autograd, on the CPU, layers whose mode is not the net's)
ProgramKey = tuple[tuple[str, ...], bool, bool, bool, tuple[str, ...]]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while a net is built. A build allocates ~20 objects a
    layer (each module's dicts) and frees none, so the collector finds nothing, but its
    full passes, which ~100k allocations trigger, walk every object the program holds:
    ResNet-152, one thread, 9-19 ms of a 230 ms ``load`` (more the more objects live)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class TorchNet(nn.Module):
    """A Caffe net compiled to torch modules; see ``torchcaffe.load``."""

    def __init__(
        self,
        net_param: caffe_pb2.NetParameter,
        phase: int | str | None = None,
        *,
        level: int | None = None,
        stages: Iterable[str] | None = None,
        path: PathLike | None = None,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        super().__init__()
        # Caffe's Net(file, phase, level, stages): the phase and level given replace the
        # file's ``state``, the stages given are added to its own
        state = caffe_pb2.NetState()
        state.CopyFrom(net_param.state)
        if phase is not None or level is not None or stages is not None:
            state = make_state(
                state.phase if phase is None else phase,
                state.level if level is None else level,
                [*state.stage, *stage_list(stages or ())],
            )
        self.path = None if path is None else os.fspath(path)
        self.net_param = net_param
        self.state = state
        with _collector_paused():
            built = build_net(net_param, state, path=self.path, input_shapes=input_shapes)
        self.name = built.name
        self.layers = LayerDict(built.modules)
        self.steps: list[LayerStep] = built.steps
        self.blob_shapes: dict[str, Shape] = built.blob_shapes
        self.blob_names: list[str] = built.blob_order
        self.input_names: list[str] = built.input_names
        self.output_names: list[str] = built.output_names
        self.param_infos: list[ParamInfo] = built.params
        self.force_backward = built.force_backward
        self._step_by_name = {s.name: s for s in self.steps}
        # (shape, dtype) per input of the last call checked (``_check_inputs``)
        self._known_inputs: dict[str, tuple[Shape, torch.dtype | None]] = {
            n: (self.blob_shapes[n], None) for n in self.input_names
        }
        # nn.Module ``_apply`` calls (``.to()``, ``.double()``, ``share_memory()``): each may
        # give the params new memory, which the Caffe face's param blobs then follow
        self.conversions = 0
        set_requires_grad(built.modules, self.steps)
        self.train(self.phase == caffe_pb2.TRAIN)
        # Passes (net/passes): inference ones when no autograd is recorded, training ones when
        # it is; off: Caffe's literal layer-by-layer program always. Programs are cached per
        # observable set (as sorted names: dynamo names a param it reaches through this dict
        # by the key, and inductor's cache cannot pickle a frozenset there), mode, kind and
        # whether it runs on the CPU (some passes are for the CPU's kernels alone), and the
        # layers whose own mode differs from the net's.
        self.optimize = True
        self._programs: dict[ProgramKey, OptimizedProgram] = {}
        self._trace_token = new_token(self)  # how dynamo's trace reaches it (untraced_build)
        self._literal_programs: dict[frozenset[str], OptimizedProgram] = {}
        self._finite_params = FiniteParams()
        # every layer's blobs, read as they are on each call (``_records_autograd``)
        self._blob_slots = module_slots(self.layers.values())
        self._hooks_seen = (-1, False)  # (hook_watch.EPOCH when scanned, any layer hooked)
        # ``layers._changes`` when the caches above were made (``_follow_layer_changes``)
        self._layers_seen = self.layers._changes
        mode_watch.watch(self)  # keeps ``_off_mode_layers`` (set by ``train`` above) current
        fused_steps.install()  # a fused optimizer's step bumps the versions the folds read
        self._observe_outputs = frozenset(self.output_names)
        self._observe_all = frozenset(self.blob_names)
        self.__class__ = with_own_forward(type(self), architecture(self.net_param, self.state))

    def __prepare_scriptable__(self) -> TorchNet:
        """``torch.jit.script`` asks this first: refuse it plainly (TorchScript cannot compile
        the layers' Python, and failed on the first protobuf annotation it met)."""
        raise UnsupportedError(
            "torch.jit.script cannot compile a Caffe net (its layers are Python over Caffe's "
            "params)",
            path=self.path,
            expected="a traced or exported form",
            hint="torch.jit.trace(net, example_inputs, strict=False), "
            "torchcaffe.net.export.export_net (torch.export) or "
            "torchcaffe.converters.onnx.export_onnx",
        )

    def __reduce__(self) -> tuple[object, ...]:
        """Pickles (and copies) as the net's own class; ``__setstate__`` gives the copy the
        class of its architecture again (see ``own_forward``)."""
        return new_instance, (base_class(type(self)),), self.__getstate__()

    def __getstate__(self) -> dict[str, object]:
        """The module's state less the pass-optimized programs, a cache that ``forward``
        rebuilds (their runners are slotted and pickle only at protocol 2 and up)."""
        state: dict[str, object] = super().__getstate__()
        state["_programs"] = {}
        state["_literal_programs"] = {}
        state.pop("_blob_slots", None)  # the layers' dicts: the copy's own, made again
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        super().__setstate__(state)
        self._trace_token = new_token(self)  # a copy's own (the pickled one names the original)
        self.__dict__.setdefault("_hooks_seen", (-1, False))  # a pickle from before 363eaaf
        self.__dict__.setdefault("_finite_params", FiniteParams())  # and from before this
        self.__dict__.setdefault("_literal_programs", {})  # and from before literal ones
        self.__dict__.pop("_modes_seen", None)  # a pickle from before mode_watch
        self.layer_modes_changed()
        mode_watch.watch(self)
        fused_steps.install()
        self.__dict__.setdefault("conversions", 0)  # and from before the conversion count
        if "_known_inputs" not in self.__dict__:  # a pickle from before the dtype check
            self._known_inputs = {}
        layers = self._modules["layers"]
        if not isinstance(layers, LayerDict):  # a pickle from before LayerDict
            assert layers is not None
            layers.__class__ = LayerDict
        self._layers_seen = self._layer_dict()._changes
        self._blob_slots = module_slots(self.layers.values())
        self.__class__ = with_own_forward(type(self), architecture(self.net_param, self.state))

    # -- identity --------------------------------------------------------------------------
    @property
    def phase(self) -> int:
        return self.state.phase

    @property
    def layer_names(self) -> list[str]:
        return [s.name for s in self.steps]

    def layer(self, name: str) -> CaffeLayer:
        """The module of Caffe layer ``name``: its CaffeLayer, or a module a user put in its
        place in ``layers`` (typed as the layer, as most are)."""
        return cast(CaffeLayer, self.layers[self.step(name).key])

    def holds_user_module(self, step: LayerStep) -> bool:
        """Does a module a user put in ``layers`` (not a CaffeLayer) run ``step``?"""
        return not isinstance(self.layers[step.key], CaffeLayer)

    def module_of(self, step: LayerStep) -> CaffeLayer:
        """The CaffeLayer that runs ``step``, for what reads a Caffe layer's contract (its
        param blobs, shapes, LayerParameter). A module a user put in its place in ``layers``
        runs in a forward and trains, but has none of that: an UnsupportedError here."""
        module = self.layers[step.key]
        if not isinstance(module, CaffeLayer):
            raise UnsupportedError(
                f"layer {step.name!r} is a {type(module).__name__} put in net.layers, which "
                "has no Caffe layer's param blobs, shapes or LayerParameter",
                path=self.path,
                layer=step.name,
                layer_type=step.type,
                expected="a torchcaffe layer (CaffeLayer)",
                got=type(module).__name__,
                hint="run the net's forward and torch optimizers on it; put a Caffe layer back "
                "for shape inference, Caffe's solver, the Caffe face or a caffemodel",
            )
        return module

    def step(self, name: str) -> LayerStep:
        try:
            return self._step_by_name[name]
        except KeyError:
            import difflib

            close = difflib.get_close_matches(name, list(self._step_by_name), n=3)
            raise UnknownLayerError(
                f"no layer named {name!r} in net '{self.name}'",
                path=self.path,
                hint=f"close matches: {close}" if close else None,
            ) from None

    def loss_weights(self) -> dict[str, float]:
        """Blob -> loss weight, for every top with a nonzero weight."""
        out: dict[str, float] = {}
        for step in self.steps:
            for top, w in zip(step.tops, step.loss_weights):
                if w:
                    out[top] = w
        return out

    def total_loss(self, blobs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Caffe's objective: sum over weighted tops of weight * sum(top).

        Every weighted top must be in ``blobs``: a loss layer's unnamed top is no net output,
        so ``net(...)`` lacks it, and leaving it out would drop that loss silently."""
        weights = self.loss_weights()
        if not weights:
            raise LayerParamError(
                "this net has no loss (no top with a loss weight)", path=self.path
            )
        missing = [name for name in weights if name not in blobs]
        if missing:
            raise UsageError(
                f"blobs lacks the loss tops {missing}",
                path=self.path,
                hint="pass net.forward_all_blobs(...): a loss layer's unnamed top, and a loss "
                "top another layer reads, are not net outputs",
            )
        return torch.stack([w * blobs[name].sum() for name, w in weights.items()]).sum()

    # -- running -----------------------------------------------------------------------------
    def bind_inputs(
        self, args: Sequence[torch.Tensor], kwargs: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        try:
            given = len(args)
        except RuntimeError:  # torch.fx's symbolic tracer hands ``*args`` over as a Proxy
            if isinstance(args, torch.fx.Proxy):
                raise self._symbolic_trace_error() from None
            raise
        if given > len(self.input_names):
            raise BlobWiringError(
                "too many positional inputs",
                path=self.path,
                expected=f"at most {len(self.input_names)} ({', '.join(self.input_names)})",
                got=len(args),
            )
        blobs = dict(zip(self.input_names, args))
        for name, value in kwargs.items():
            if name not in self.input_names:
                raise self._not_an_input(name)
            if name in blobs:
                raise BlobWiringError(f"input {name!r} given twice", path=self.path)
            blobs[name] = value
        missing = [n for n in self.input_names if n not in blobs]
        if missing:
            raise BlobWiringError(
                f"missing input blob(s) {missing}",
                path=self.path,
                hint=f"call the net with {', '.join(self.input_names)}",
            )
        self._check_inputs(blobs)
        for name, value in blobs.items():
            if not value.is_floating_point():
                blobs[name] = self._as_blob(name, value)
        return blobs

    def _as_blob(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """An integer input in the params' dtype. A 16-bit net's would round integers past 256
        (bfloat16) or 2048 (float16): a label 999 became 1000, a wrong class or an index past
        the scores, where Caffe's float is exact; that is a UsageError instead."""
        dtype = self._blob_dtype()
        blob = value.to(dtype)
        if is_narrow(dtype) and value.dtype != torch.bool:
            inexact = blob.to(value.dtype) != value
            if bool(inexact.any()):
                first = int(value[inexact].reshape(-1)[0])
                raise UsageError(
                    f"input {name!r} holds {first}, which {dtype} cannot represent exactly "
                    f"(it would read {float(torch.tensor(first).to(dtype))})",
                    path=self.path,
                    hint="run the net in float32 (a label's blob takes the net's dtype)",
                )
        return blob

    def _blob_dtype(self) -> torch.dtype:
        """The dtype an integer or bool input (a uint8 image, an int64 label) is cast to: the
        params'. Caffe's blobs hold floats, and its data layers cast so (exact below 2**24 in
        float32); torch would stop in the first Convolution, and a Flatten would pass the
        integers through."""
        tensors = itertools.chain(self.parameters(), self.buffers())
        return next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)

    def _symbolic_trace_error(self) -> UnsupportedError:
        """``torch.fx.symbolic_trace(net)`` feeds proxies that carry no shape, and Caffe's
        layers size their tops from the bottoms' shapes: say what traces a net instead of
        letting fx fail on the first ``len``."""
        return UnsupportedError(
            "torch.fx.symbolic_trace cannot trace a Caffe net (its layers read the bottoms' "
            "shapes, which fx's proxies do not carry)",
            path=self.path,
            expected="a trace that runs the net on example inputs",
            hint="torch.export.export(net, (), {"
            + ", ".join(f"{n!r}: x" for n in self.input_names)
            + "}).module() is an fx GraphModule; torch.jit.trace(net, example_inputs, "
            "strict=False) also traces it",
        )

    def _not_an_input(self, name: str) -> BlobWiringError:
        """The error for a keyword that names no input blob. A blob a layer computes (a data
        layer's top included) would be overwritten by the run, so the tensor is refused
        rather than silently ignored, as pycaffe's ``forward(**kwargs)`` refuses it."""
        producer = next((s for s in self.steps if name in s.tops and not s.is_input), None)
        if producer is None:
            return BlobWiringError(
                f"unknown input blob {name!r}",
                path=self.path,
                expected=f"one of {self.input_names}",
                got=name,
            )
        hint = None
        if producer.type in SOURCE_LAYER_TYPES:
            hint = (
                f"to feed it, load with input_shapes={{{name!r}: (N, ...)}}, which turns "
                f"{producer.type} layer '{producer.name}' into an input"
            )
        return BlobWiringError(
            f"blob {name!r} is not an input: layer '{producer.name}' ({producer.type}) "
            "computes it, so the tensor given for it would be ignored",
            path=self.path,
            expected=f"one of {self.input_names}",
            got=name,
            hint=hint,
        )

    def _check_inputs(self, blobs: Mapping[str, torch.Tensor]) -> None:
        """Each input is a tensor; per new input shape or dtype, the shapes are inferred again
        and a floating-point input must have the params' dtype (torch would stop at the first
        layer with a bare RuntimeError; an integer one is cast, see ``_blob_dtype``)."""
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return
        for name in self.input_names:
            value = blobs[name]
            if not isinstance(value, torch.Tensor):
                raise UsageError(
                    f"input {name!r} is a {type(value).__name__}, not a torch.Tensor",
                    path=self.path,
                    hint="the torch face takes tensors (torch.from_numpy(array)); "
                    "caffe.Net takes numpy arrays",
                )
        kinds: dict[str, tuple[Shape, torch.dtype | None]] = {
            n: (tuple(blobs[n].shape), blobs[n].dtype) for n in self.input_names
        }
        known = self._known_inputs
        if kinds != known:
            self._check_dtypes(blobs)
            shapes = {n: shape for n, (shape, _) in kinds.items()}
            if shapes != {n: shape for n, (shape, _) in known.items()}:
                # once per shape: a Python layer's reshape runs; a user's module runs as it is
                self.infer_shapes(shapes, until_user_module=True)
            self._known_inputs = kinds

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> TorchNet:
        """nn.Module's ``.to()`` / ``.double()`` / ``.half()``, after which the next call checks
        its inputs' dtypes again (the params' dtype may have changed; shapes stay known)."""
        out = super()._apply(fn, recurse)
        self.conversions += 1
        self._known_inputs = {n: (shape, None) for n, (shape, _) in self._known_inputs.items()}
        return out

    def _check_dtypes(self, blobs: Mapping[str, torch.Tensor]) -> None:
        param = next(self.parameters(), None)
        if param is None:
            return
        for name in self.input_names:
            dtype = blobs[name].dtype
            if dtype.is_complex or (dtype.is_floating_point and dtype != param.dtype):
                raise UsageError(
                    f"input {name!r} is {dtype} but the net's params are {param.dtype}",
                    path=self.path,
                    hint=f"pass x.to({param.dtype}), or convert the net (net.to({dtype}))",
                )

    def infer_shapes(
        self, input_shapes: Mapping[str, Sequence[int]], until_user_module: bool = False
    ) -> dict[str, Shape]:
        """Every blob's shape for these input shapes (Caffe's Net::Reshape), without compute.

        Raises a located error when a layer cannot take the new shapes. With
        ``until_user_module``, the shapes up to the first module a user put in ``layers``
        (whose tops only a run can size) instead of ``module_of``'s UnsupportedError there.
        """
        shapes: dict[str, Shape] = {n: tuple(int(d) for d in s) for n, s in input_shapes.items()}
        for step in self.steps:
            if step.is_input:
                continue
            if until_user_module and self.holds_user_module(step):
                break
            bottoms = [shapes[b] for b in step.bottoms]
            try:
                tops = self.module_of(step).output_shapes(bottoms)
            except TorchCaffeError as err:
                raise err.located(path=self.path, layer=step.name, layer_type=step.type) from None
            except (RuntimeError, ValueError, IndexError) as err:
                raise LayerParamError(
                    f"cannot reshape for bottom shapes {bottoms}: {err}",
                    path=self.path,
                    layer=step.name,
                    layer_type=step.type,
                ) from None
            shapes.update(zip(step.tops, tops))
        return shapes

    def run_step(
        self, step: LayerStep, bottoms: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        """One layer's forward; always returns a tuple of tops."""
        try:
            out = self.layers[step.key](*bottoms)
        except TorchCaffeError as err:  # as in ``run``: name the file too
            raise err.located(path=self.path) from None
        return out if isinstance(out, tuple) else (out,)

    def optimized_program(
        self, observable: Iterable[str] | None = None, device: torch.device | None = None
    ) -> OptimizedProgram:
        """The inference program (every pass applied) for a run on ``device`` (default: where
        the params are) whose caller reads the blobs ``observable`` afterwards (default: the
        net's outputs); see ``net/passes``."""
        return self._cached_program(observable, autograd=False, device=device)

    def training_program(
        self, observable: Iterable[str] | None = None, device: torch.device | None = None
    ) -> OptimizedProgram:
        """The program (training passes applied) for a forward that autograd records."""
        return self._cached_program(observable, autograd=True, device=device)

    def params_changed(self) -> None:
        """Forget what was derived from the params and cached on their tensor versions: folded
        weights, packed convolution weights, a BatchNorm's scaled statistics (off the CPU).
        Writes by torch ops bump those versions, and a learnable param's ``.data`` is watched
        (``ops.data_watch``); call this after a write that neither shows: through a numpy
        view (``.detach().numpy()``), a buffer's ``.data``, or a tensor kept from ``.data``.
        The Caffe face calls it for writes through its param blobs."""
        self._finite_params.forget()
        for module in self.layers.values():
            for name in ("weight_cache", "stats_cache"):
                cache = getattr(module, name, None)
                if cache is not None:
                    cache.forget()
            for fold in getattr(module, "graph_folds", {}).values():  # a compiled graph's
                fold.forget()
        for program in self._programs.values():
            for cache in program.derived_caches():
                cache.forget()

    def _cached_program(
        self, observable: Iterable[str] | None, autograd: bool, device: torch.device | None
    ) -> OptimizedProgram:
        if self._layer_dict()._changes != self._layers_seen:
            self._follow_layer_changes()
        seen = self._observe_outputs if observable is None else frozenset(observable)
        if device is None:
            device = next((p.device for p in self.parameters()), None)
        on_cpu = device is None or device.type == "cpu"
        key = (tuple(sorted(seen)), self.training, autograd, on_cpu, self.layers_off_mode())
        if dynamo_is_tracing():  # the passes run as Python, not traced (``untraced_build``)
            build_untraced(self._trace_token, key)
        return self.program_for_key(key)

    def program_for_key(self, key: ProgramKey) -> OptimizedProgram:
        """The cached program for ``key`` (``_cached_program``), built on first use."""
        program = self._programs.get(key)
        if program is None:
            names, _, autograd, on_cpu, _ = key
            seen = frozenset(names)
            if autograd:
                program = optimize_for_training(self.steps, self.layers, seen, on_cpu)
            else:
                program = optimize_for_inference(self.steps, self.layers, seen, on_cpu)
            program = program.with_releases(seen)
            self._programs[key] = program
        return program

    def _follow_layer_changes(self) -> None:
        """A module was put in ``layers`` or taken out (``LayerDict``): the programs, which
        call the modules they were made from, are made again, and the caches of where the
        params live, which layers are hooked and which are in another mode are read again."""
        self._programs.clear()
        self._literal_programs.clear()
        self._blob_slots = module_slots(self.layers.values())
        self._hooks_seen = (-1, False)
        self.layer_modes_changed()
        self._layers_seen = self._layer_dict()._changes

    @property
    def layer_changes(self) -> int:
        """How many times a module was put in ``layers`` or taken out (``LayerDict``)."""
        return self._layer_dict()._changes

    def _layer_dict(self) -> LayerDict:
        """``layers``, read without ``nn.Module.__getattr__``'s search (once a forward)."""
        return cast(LayerDict, self._modules["layers"])

    def layers_off_mode(self) -> tuple[str, ...]:
        """The layers whose train/eval mode is not the net's (``train()`` on one layer, or a
        layer with its own ``phase``), part of a program's key: a pass decides by the modes
        (a BatchNorm whose mode picks global statistics folds into its Convolution, which
        would go on using them after ``bn.train()``). Kept current by ``train`` and by
        ``mode_watch``; dynamo guards its value, so a compiled net traces again after a
        switch."""
        return self._off_mode_layers

    def layer_modes_changed(self) -> None:
        """Read the layers' modes again (``mode_watch``)."""
        self._off_mode_layers: tuple[str, ...] = tuple(
            key for key, m in self.layers.items() if m.training != self.training
        )

    def train(self, mode: bool = True) -> TorchNet:
        """nn.Module's ``train``; the layers left in another mode (their own ``phase``) are
        read once after, not once per layer switched."""
        with mode_watch.quiet():
            super().train(mode)
        self.layer_modes_changed()
        return self

    def _records_autograd(self, inputs: Mapping[str, torch.Tensor]) -> bool:
        """Will autograd record a run over ``inputs``: grad enabled, and an input or a blob of
        the net requires grad? A frozen net (``requires_grad_(False)``) run without
        ``no_grad`` records nothing and runs the inference program, as under ``no_grad``
        (ResNet-50 at batch 1, 2 threads: 34 -> 21 ms; it had run the training program, whose
        folds are ops of the run). Read on every call: a flag set since is seen. Under
        torch.compile grad mode alone decides (reading each blob there would guard it)."""
        if not torch.is_grad_enabled():
            return False
        if torch.compiler.is_compiling():
            return True
        return any(t.requires_grad for t in inputs.values()) or any_requires_grad(self._blob_slots)

    def _program_for(
        self, observable: frozenset[str], inputs: Mapping[str, torch.Tensor]
    ) -> OptimizedProgram | None:
        """The passes' program for this run; with ``optimize`` off or a layer hooked, Caffe's
        literal layer-by-layer one as a program that frees what no later layer reads
        (``_literal_program``); None (the literal walk over ``steps``) under torch.jit's
        tracer and, with the passes off, torch.compile. A traced graph
        must read every param by name, as a traced module's ``load_state_dict`` and its
        optimizer write them there, and be the same graph with or without autograd (the
        trace's check runs under ``no_grad``); the passes' folds, cached outside the trace,
        would be baked in as constants, and their programs differ by mode.

        Under a torch.func transform (vmap, grad, jvp, ...) the training program runs, with
        or without autograd: its folds are ops of the run, recomputed from the params each
        call, so no cache keeps the transform's wrapped params as the inference program's
        would. Per-sample gradients of MobileNetV2 at batch 4, 2 threads: 220 -> 159 ms
        (the literal program's BatchNorm and Scale passes over the activations are gone)."""
        device = self._device_of(inputs)
        if under_func_transform():
            self._check_func_transformable()
            if not self.optimize or self.layers_hooked():
                return None
            return self._cached_program(observable, True, device)
        if torch.jit.is_tracing():
            return None
        if not self.optimize or self.layers_hooked():
            return None if torch.compiler.is_compiling() else self._literal_program(observable)
        return self._cached_program(observable, self._records_autograd(inputs), device)

    def _literal_program(self, observable: frozenset[str]) -> OptimizedProgram:
        """Caffe's layer-by-layer program, each layer called as a module, with releases: a
        hooked net (ResNet-50 with one forward hook, say) keeps no more blobs alive than a
        torch model's locals, where the walk over ``steps`` held every one until it
        returned."""
        if self._layer_dict()._changes != self._layers_seen:
            self._follow_layer_changes()
        program = self._literal_programs.get(observable)
        if program is None:
            program = OptimizedProgram.literal(list(self.steps), self.layers)
            program = self._literal_programs[observable] = program.with_releases(observable)
        return program

    def _check_func_transformable(self) -> None:
        """Raise UnsupportedError, naming the layer, for the first layer a torch.func transform
        cannot run, before torch fails inside it with an error that names no layer."""
        for layer in self._caffe_layers(self.steps):  # a user's module runs as it is
            why = layer.host_forward or (
                "the sizes of its tops depend on the values" if layer.shape_depends_on_data else ""
            )
            if why:
                raise layer.error(
                    f"cannot run under a torch.func transform (vmap, grad, jacrev, ...): {why}",
                    cls=UnsupportedError,
                    expected="a net whose layers are torch ops of fixed shape",
                    got=f"a {layer.caffe_type} layer",
                    hint="run the net outside the transform (a loop over samples for vmap)",
                ).located(path=self.path)

    def _caffe_layers(self, steps: Sequence[LayerStep]) -> Iterator[CaffeLayer]:
        """The Caffe layers of ``steps``: no input, no user's module in a layer's place."""
        for step in steps:
            if not step.is_input and not self.holds_user_module(step):
                yield self.module_of(step)

    def first_value_shaped(self, steps: Sequence[LayerStep]) -> int | None:
        """The index in ``steps`` of the first Caffe layer whose tops' sizes depend on the
        values (DetectionOutput, Proposal, Filter, DetectionEvaluate), or None: what a trace
        cannot record."""
        for i, step in enumerate(steps):
            if step.is_input or self.holds_user_module(step):
                continue
            if self.module_of(step).shape_depends_on_data:
                return i
        return None

    def _check_traceable(self, steps: Sequence[LayerStep]) -> None:
        """Raise UnsupportedError, naming the layer, for the first of ``steps`` whose tops'
        sizes depend on the values (``first_value_shaped``): torch.jit.trace would record its
        loops and sizes as the example ran them, and the traced net would give another input
        the example's count of detections."""
        found = self.first_value_shaped(steps)
        if found is not None:
            layer = self.module_of(steps[found])
            raise layer.error(
                "torch.jit.trace cannot record this layer: the sizes of its tops depend on "
                "the values, and a trace would keep the example's",
                cls=UnsupportedError,
                expected="layers whose tops' sizes follow from the bottoms' shapes",
                got=f"a {layer.caffe_type} layer",
                hint="run the net itself (eager or torch.compile); to export the layers "
                "before it, export_onnx(net, path, outputs=[...]) traces up to those blobs",
            ).located(path=self.path)

    def layers_hooked(self) -> bool:
        """Do torch hooks watch any layer (``ops.hook_watch``)? Then ``forward`` runs every
        layer as a module, without the passes, so each hook sees its layer's call. Not read
        under torch.compile, whose guards would then check every layer's hook dicts on each
        call: a compiled graph runs the passes' steps as they are."""
        if torch.compiler.is_compiling():
            return False
        if hook_watch.global_hooks():
            return True
        epoch, hooked = self._hooks_seen
        if hooked or epoch != hook_watch.EPOCH[0]:
            hooked = hook_watch.any_hooked(self.layers.values())
            self._hooks_seen = (hook_watch.EPOCH[0], hooked)
        return hooked

    def run(
        self,
        blobs: dict[str, torch.Tensor],
        start: int = 0,
        end: int | None = None,
        program: OptimizedProgram | None = None,
    ) -> dict[str, torch.Tensor]:
        """Run steps ``start..end`` (inclusive) over ``blobs`` in place; returns ``blobs``.

        With ``program`` (a pass-optimized program, whole net only) its steps and runners run,
        and the blobs it releases are dropped from ``blobs`` as soon as no later step reads
        them. On CUDA it runs in Caffe's IEEE float32 (``caffe_float32``); traced by dynamo,
        under the settings the compiled call runs with.
        """
        if torch.compiler.is_compiling():
            return self._run(blobs, start, end, program)
        try:
            if on_cuda(self._device_of(blobs)):
                with caffe_float32():
                    return self._run(blobs, start, end, program)
            return self._run(blobs, start, end, program)
        except TorchCaffeError as err:  # a layer's own run-time check (a data layer's new
            raise err.located(path=self.path) from None  # top shape) knows no file: add it

    def _device_of(self, blobs: Mapping[str, torch.Tensor]) -> torch.device | None:
        """Where a run over ``blobs`` computes: its first input's device, else (a net fed by
        data layers) its first parameter's."""
        for t in blobs.values():
            return t.device
        return next((p.device for p in self.parameters()), None)

    def _run(
        self,
        blobs: dict[str, torch.Tensor],
        start: int,
        end: int | None,
        program: OptimizedProgram | None,
    ) -> dict[str, torch.Tensor]:
        if program is not None and not torch.compiler.is_compiling():
            return self._run_eager(blobs, program)
        if program is not None:
            runners = program.traced_runners
            for key, names, keeps, tops, dead in program.walk:
                if key is not None:
                    reads = [blobs[b] if k else blobs[b].detach() for b, k in zip(names, keeps)]
                    runner: Any = runners[key]
                    if isinstance(runner, nn.Module):
                        out = runner(*reads)  # dynamo inlines its hooks, as for any module
                    else:
                        # named, the method is looked up as any other; called as ``runner(...)``
                        # dynamo guards ``type(runner).__call__.__code__``, four guard nodes a
                        # runner, checked on every call (MobileNetV2: 212 of 4,487 lines)
                        out = runner.__call__(*reads)
                    if isinstance(out, tuple):
                        blobs.update(zip(tops, out))
                    else:
                        blobs[tops[0]] = out
                for name in dead:  # no later step reads it, the caller does not observe it
                    blobs.pop(name, None)
            return blobs
        end = len(self.steps) - 1 if end is None else end
        if torch.jit.is_tracing():
            self._check_traceable(self.steps[start : end + 1])
        for step in self.steps[start : end + 1]:
            if step.is_input:
                continue
            bottoms = [
                blobs[b] if keep else blobs[b].detach()
                for b, keep in zip(step.bottoms, step.propagate_down)
            ]
            blobs.update(zip(step.tops, self.run_step(step, bottoms)))
        return blobs

    def _run_eager(
        self, blobs: dict[str, torch.Tensor], program: OptimizedProgram
    ) -> dict[str, torch.Tensor]:
        """``program`` over ``blobs`` as ``_run`` does, from its ``eager_walk``; in a run
        whose inputs and params are finite, its steps after layers that keep values finite
        take their faster form (``passes/finite.py``)."""
        if program.finite_steps and not torch.jit.is_tracing():  # no checks in a trace
            with fused_relu.finite_run(self._finite_run(blobs, program)):
                return self._walk_eager(blobs, program)
        return self._walk_eager(blobs, program)

    def _finite_run(self, blobs: dict[str, torch.Tensor], program: OptimizedProgram) -> bool:
        """Are the run's inputs, on the CPU, and the params ``program`` reads unfolded all
        finite? The params' answer is kept until one of them changes (``params_changed`` for
        writes that bump no version); a fold checks its own weights."""
        for t in blobs.values():
            if not t.is_cpu:
                return False  # the epilogue is oneDNN's, on the CPU; no device sync here
            # a NaN or infinity anywhere makes the sum one (a finite sum past float32's range
            # too, which only costs the epilogue): 6x faster than isfinite().all()
            if t.is_floating_point() and not bool(t.sum().isfinite()):
                return False
        return self._finite_params.check(program)

    @staticmethod
    def _walk_eager(
        blobs: dict[str, torch.Tensor], program: OptimizedProgram
    ) -> dict[str, torch.Tensor]:
        """The walk itself (the runners themselves, no per-step key lookup or detach test
        where nothing is detached): a GPU's eager runs are bound by this host work."""
        for name in program.input_releases:
            blobs.pop(name, None)
        for runner, names, keeps, tops, dead in program.eager_walk:
            if keeps is None:
                if len(names) == 1:  # most steps: no list to build
                    out = runner(blobs[names[0]])
                else:
                    out = runner(*[blobs[b] for b in names])
            else:
                out = runner(*[blobs[b] if k else blobs[b].detach() for b, k in zip(names, keeps)])
            if isinstance(out, tuple):
                blobs.update(zip(tops, out))
            else:
                blobs[tops[0]] = out
            for name in dead:
                blobs.pop(name, None)
        return blobs

    def forward(self, *args: torch.Tensor, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """``net(data=x)`` -> {output blob name: tensor} (Caffe's net outputs, sorted by name)."""
        blobs = self.bind_inputs(args, inputs)
        program = self._program_for(self._observe_outputs, blobs)
        blobs = self.run(blobs, program=program)
        return self._backward_in_ieee({name: to_nchw(blobs[name]) for name in self.output_names})

    def forward_all_blobs(
        self, *args: torch.Tensor, **inputs: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Like ``forward`` but returns every blob (in-place blobs hold their last value)."""
        blobs = self.bind_inputs(args, inputs)
        program = self._program_for(self._observe_all, blobs)
        blobs = self.run(blobs, program=program)
        return self._backward_in_ieee({name: to_nchw(t) for name, t in blobs.items()})

    def _backward_in_ieee(self, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``outputs``, whose backward (on CUDA, eagerly recorded) runs in IEEE float32."""
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            first = next(iter(outputs.values()), None)
            if first is not None and on_cuda(first.device):
                caffe_float32_backward(outputs.values())
        return outputs

    def extra_repr(self) -> str:
        return (
            f"name={self.name!r}, phase={caffe_pb2.Phase.Name(self.phase)}, "
            f"inputs={self.input_names}, outputs={self.output_names}"
        )
