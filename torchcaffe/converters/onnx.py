"""A compiled Caffe net (TorchNet) -> ONNX with torch.onnx, either exporter, dynamic batch.

The net's forward takes named blobs and returns a dict; ONNX wants positional inputs and a
tuple of outputs, so a thin wrapper fixes the order (Caffe's input order, the net's output
order) and the ONNX graph's input/output names are the Caffe blob names.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import warnings
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ..errors import ExportError, MissingPackageError
from ..formats.atomic import atomic_write
from ..net.export import (
    batch_axis_names,
    batch_groups,
    first_line,
    registration_hooks_kept,
    state_kept,
)
from ..net.net import TorchNet
from ..proto import caffe_pb2

PathLike = str | os.PathLike


class PositionalNet(nn.Module):
    """``net`` with positional inputs (``net.input_names`` order) and a tuple of outputs.
    It runs the net's steps up to the last that writes one of the outputs: the layers after
    it are not traced (an SSD exported up to its heads, before a DetectionOutput that
    neither exporter can write)."""

    def __init__(self, net: TorchNet, outputs: Sequence[str] | None = None) -> None:
        super().__init__()
        self.net = net
        self.outputs = list(outputs or net.output_names)
        self.end: int | None = None  # a look-alike (compare's every-top net) runs whole
        if isinstance(net, TorchNet):
            writers = [s.index for s in net.steps if set(s.tops) & set(self.outputs)]
            self.end = max(writers, default=0)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        blobs = dict(zip(self.net.input_names, inputs))
        blobs = self.net.run(blobs) if self.end is None else self.net.run(blobs, end=self.end)
        return tuple(blobs[name] for name in self.outputs)


def export_onnx(
    net: TorchNet,
    path: PathLike,
    *,
    dynamo: bool = True,
    dynamic_batch: bool = True,
    opset_version: int | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    outputs: Sequence[str] | None = None,
) -> None:
    """Write ``net`` (in TEST phase, eval mode) as an ONNX model at ``path``.

    ``dynamo`` picks torch's torch.export-based exporter (needs onnxscript) over the legacy
    TorchScript one. ``dynamic_batch`` makes axis 0 of every input and output symbolic.
    ``input_shapes`` overrides the example shapes (default: the net's declared input shapes).
    ``outputs`` names the blobs to export as graph outputs (default: the net's outputs but
    its input blobs, such as PSPNet's ``data_dim``, which no layer reads).
    """
    _require("onnx", "onnx")
    if dynamo:
        _require("onnxscript", "onnx")
    if net.phase != caffe_pb2.TEST:
        raise ExportError(
            "only TEST-phase nets export to ONNX (data layers and losses have no ONNX form)",
            path=net.path,
            hint="load the net with phase='test'",
        )
    # a net its data layers feed (DummyData) has no input whose batch could be symbolic
    dynamic_batch = dynamic_batch and bool(net.input_names)
    shapes = {n: tuple(net.blob_shapes[n]) for n in net.input_names}
    shapes.update({n: tuple(s) for n, s in (input_shapes or {}).items()})
    groups: dict[str, int] = {}
    if dynamic_batch:
        # torch.export fixes sizes 0 and 1: a net whose inputs all have batch 1 is traced at 2
        if all(s and s[0] <= 1 for s in shapes.values()):
            shapes = {n: (2, *s[1:]) for n, s in shapes.items()}
        groups = batch_groups(net, shapes)  # which inputs' axis 0 is symbolic, and shared
    device = _device_of(net)  # example on the net's device; the ONNX graph carries none
    example = tuple(torch.rand(shapes[n], device=device) * 2 - 1 for n in net.input_names)
    unknown = [b for b in outputs or () if b not in net.blob_shapes]
    if unknown:
        raise ExportError(
            f"unknown output blob(s) {unknown}", path=net.path, expected=f"blobs of {net.name}"
        )
    passed_through = [b for b in outputs or () if b in net.input_names]
    if dynamo and passed_through:  # its graph would define the name twice (onnxruntime refuses)
        raise ExportError(
            f"the dynamo exporter cannot make the input blob(s) {passed_through} outputs too",
            path=net.path,
            hint="export with dynamo=False, or leave them out of outputs",
        )
    if not outputs:  # the computed outputs: an input blob no layer reads is not one
        outputs = [n for n in net.output_names if n not in net.input_names]
    wrapper = PositionalNet(net, outputs).eval()
    if not wrapper.outputs:  # every top is read by a later layer (a Silence at the end)
        raise ExportError(
            "the net has no output blobs to export",
            path=net.path,
            hint="name the blobs to export with outputs=[...] (--outputs)",
        )
    was_training = net.training
    net.eval()
    kw: dict = dict(
        input_names=list(net.input_names),
        output_names=list(wrapper.outputs),
        dynamo=dynamo,
    )
    if dynamo:
        kw["optimize"] = False  # optimized below, without the rules that drop small constants
    if opset_version is not None:
        kw["opset_version"] = opset_version
    if dynamic_batch:
        names = batch_axis_names(groups)
        if dynamo:
            dims = {name: torch.export.Dim(name) for name in names.values()}
            kw["dynamic_shapes"] = {
                "inputs": tuple({0: dims[names[n]]} if n in names else {} for n in net.input_names)
            }
        else:
            axes = {n: {0: name} for n, name in names.items()}
            axes.update({n: {0: "batch"} for n in wrapper.outputs if n not in axes})
            kw["dynamic_axes"] = axes
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", (DeprecationWarning, torch.jit.TracerWarning))
            if not dynamo:
                kw["f"] = buffer = io.BytesIO()  # the file is written below, whole or not at all
            # dynamo: without autograd recording (an AVE pooling that overhangs would take its
            # explicit-sums form for compiled training, which this exporter divides again)
            with (
                torch.no_grad() if dynamo else contextlib.nullcontext(),
                state_kept(net),
                registration_hooks_kept(),
            ):
                result = torch.onnx.export(wrapper, example, **kw)
        if dynamo:
            assert result is not None
            _optimize_keeping_small_constants(result)
            _name_inputs(result.model.graph, net.input_names)
            _free_blob_names(result.model.graph)
            if dynamic_batch:
                _require_symbolic_batch(result.model.graph, net, groups)
            model = result.model_proto
        else:
            model = _with_every_input(buffer.getvalue(), net.input_names, shapes, groups)
        data = model.SerializeToString()
    except ExportError:
        raise
    except Exception as err:  # torch.onnx raises many kinds; one clear line, the cause kept
        raise ExportError(
            f"torch.onnx.export ({'dynamo' if dynamo else 'TorchScript'} exporter) failed: "
            f"{type(err).__name__}: {first_line(err)}",
            path=net.path,
            hint="try the other exporter (dynamo=True/False), or dynamic_batch=False",
        ) from err
    finally:
        net.train(was_training)
    with atomic_write(path, "wb") as f:
        f.write(data)


def _with_every_input(
    data: bytes,
    inputs: Sequence[str],
    shapes: Mapping[str, Sequence[int]],
    groups: Mapping[str, int],
):
    """The TorchScript exporter's model with every input blob a graph input. It leaves out
    an input that the net reads only for its shape (a Crop's reference, a PriorBox's image),
    and onnxruntime refuses a feed that names it; it comes back unused, with its shape
    (axis 0 symbolic where the others' is)."""
    import onnx

    model = onnx.load_from_string(data)
    graph = model.graph
    present = {v.name for v in [*graph.input, *graph.output, *graph.initializer]}
    present.update(name for node in graph.node for name in node.output)
    names = batch_axis_names(groups)
    for i, name in enumerate(inputs):
        if name not in present:
            shape: list[int | str] = list(shapes[name])
            if name in names and shape:
                shape[0] = names[name]
            value = onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)
            graph.input.insert(i, value)
    return model


# onnxscript reads its default rule list from a module global, swapped for each optimize
# below: two exports in parallel threads would otherwise restore each other's swap, and the
# process would keep the list without its no-op rules
_RULES_SWAP = threading.Lock()


def _optimize_keeping_small_constants(program: torch.onnx.ONNXProgram) -> None:
    """``program.optimize()`` (onnxscript's constant folding and rewrites) without its no-op
    rules, which take a scalar within 1e-8 of 0 (or 1e-5 of 1) for exactly 0 (1) and drop
    the op: MVN's x / (sqrt(var) + 1e-9) and Normalize's eps 1e-10 lost their eps, so a
    constant row or an all-zero pixel became 0 / 0 = NaN where Caffe gives 0. Exact no-ops
    are left to onnxruntime, which removes them when it loads the graph. An onnxscript
    whose rule list this does not find is not run: the graph is correct, only larger
    (ResNet-50: 2,279 nodes against 231, 1.36x the time in onnxruntime on 2 threads).
    The rule list is swapped for the call, one export at a time (``_RULES_SWAP``)."""
    try:
        from onnxscript import rewriter
        from onnxscript.rewriter.rules.common import _no_op

        no_ops = {id(rule) for rule in _no_op.rules}
    except (ImportError, AttributeError, TypeError):
        return
    if not hasattr(rewriter, "_DEFAULT_REWRITE_RULES"):
        return
    with _RULES_SWAP:
        rules = rewriter._DEFAULT_REWRITE_RULES
        rewriter._DEFAULT_REWRITE_RULES = tuple(r for r in rules if id(r) not in no_ops)
        try:
            program.optimize()
        finally:
            rewriter._DEFAULT_REWRITE_RULES = rules


def _require_symbolic_batch(graph, net: TorchNet, groups: Mapping[str, int]) -> None:
    """torch.export fixes a symbolic batch without a word where a layer pins it (a Reshape
    to a literal batch, a size read with int()); the graph, written as if it had a dynamic
    batch, would refuse every other batch in onnxruntime. ``groups``: the inputs whose axis
    0 was asked to be symbolic."""
    fixed = {
        v.name: v.shape[0]
        for v in graph.inputs
        if v.name in groups and v.shape and isinstance(v.shape[0], int)
    }
    if fixed:
        raise ExportError(
            "the exported graph fixed the batch of its input(s) although a dynamic batch "
            "was asked for (a layer fixes it, as a Reshape to a literal batch does)",
            path=net.path,
            expected="a symbolic axis 0",
            got=fixed,
            hint="export with dynamic_batch=False (--static-batch)",
        )


def _name_inputs(graph, names: Sequence[str]) -> None:
    """The graph's inputs take the input blobs' names. Where an input flows to an output
    unchanged (a net that is one Dropout in TEST), the dynamo exporter gave the input the
    output's name plus ``_orig`` (a graph needing ``y_orig`` where the net takes ``x``)."""
    for value, name in zip(graph.inputs, names):
        value.name = name


def _free_blob_names(graph) -> None:
    """The dynamo exporter names inner values after torch ops and then renames the graph's
    inputs and outputs to the blob names without looking for clashes: an Exp layer of base 2
    whose top is ``exp`` computes an inner ``exp`` first, and onnxruntime refuses the model
    ("Duplicate definition of name"). Inner values that take a blob's name are renamed."""
    blobs = [*graph.inputs, *graph.outputs]
    reserved = {v.name for v in blobs}
    inner = [*graph.initializers.values(), *(v for node in graph for v in node.outputs)]
    inner = [v for v in inner if not any(v is b for b in blobs)]
    taken = reserved | {v.name for v in inner}
    for value in inner:
        if value.name in reserved:
            i = 1
            while f"{value.name}__{i}" in taken:
                i += 1
            value.name = f"{value.name}__{i}"
            taken.add(value.name)


def _device_of(net: TorchNet) -> torch.device:
    tensors = [*net.parameters(), *net.buffers()]
    return tensors[0].device if tensors else torch.device("cpu")


def _require(module: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingPackageError(
            f"ONNX export needs the '{module}' package",
            hint=f"pip install torchcaffe[{extra}]",
        )
