"""Run a Caffe net in torchcaffe and in a second engine, and compare every layer's output.

The engines: OpenCV's Caffe importer (fusion off, so BatchNorm/Scale/ReLU keep their own
outputs), onnxruntime (the net exported with one ONNX output per layer top), or a reference
pycaffe (the real ``caffe`` module, run one layer at a time). torchcaffe's side snapshots each
layer's tops right after that layer runs, so in-place layers (ReLU on a conv's top) are
compared layer by layer, as the other engines report them.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..api import load
from ..errors import LayerParamError, MissingPackageError, UnsupportedError
from ..net.net import TorchNet
from ..net.program import LayerStep

PathLike = str | os.PathLike
# onnxruntime runs the TorchScript exporter's graph, onnxruntime-dynamo the dynamo
# exporter's (the default of ``convert --to onnx``)
ENGINES = ("opencv", "onnxruntime", "onnxruntime-dynamo", "caffe")


@dataclass
class BlobDiff:
    layer: str
    type: str
    top: str
    shape: tuple[int, ...]
    other_shape: tuple[int, ...]
    max_abs: float
    max_rel: float  # max |a - b| / max |b| (the other engine's scale; 0/0 = 0)
    ok: bool


@dataclass
class Comparison:
    against: str
    tolerance: float
    rows: list[BlobDiff] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # layer/top the other engine lacks

    @property
    def first_divergent(self) -> BlobDiff | None:
        return next((r for r in self.rows if not r.ok), None)

    def to_json(self) -> dict:
        first = self.first_divergent
        return {
            "against": self.against,
            "tolerance": self.tolerance,
            "blobs": [asdict(r) for r in self.rows],
            "skipped": self.skipped,
            "first_divergent": None if first is None else asdict(first),
        }

    def table(self) -> str:
        head = ("layer", "type", "top", "shape", "max abs diff", "max rel diff", "")
        lines = [
            (
                r.layer,
                r.type,
                r.top,
                "x".join(map(str, r.shape))
                + ("" if r.shape == r.other_shape else f" ({'x'.join(map(str, r.other_shape))})"),
                f"{r.max_abs:.3e}",
                f"{r.max_rel:.3e}",
                "ok" if r.ok else "DIVERGES",
            )
            for r in self.rows
        ]
        widths = [max(len(str(c)) for c in col) for col in zip(head, *lines)]
        out = [
            "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
            for row in [head, *lines]
        ]
        first = self.first_divergent
        if first is None:
            out.append(
                f"all {len(self.rows)} blobs agree with {self.against} "
                f"(max rel diff <= {self.tolerance:g})"
            )
        else:
            out.append(
                f"first divergence from {self.against}: layer '{first.layer}' ({first.type}), "
                f"top '{first.top}': max rel diff {first.max_rel:.3e} > {self.tolerance:g}"
            )
        if self.skipped:
            out.append(f"not compared ({len(self.skipped)}): {', '.join(self.skipped[:12])}")
        return "\n".join(out)


# -- inputs ---------------------------------------------------------------------------------
def make_inputs(
    net: TorchNet, given: Mapping[str, np.ndarray] | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Given arrays, else uniform(-1, 1) in each input's declared shape (seeded)."""
    rng = np.random.default_rng(seed)
    given = dict(given or {})
    unknown = sorted(set(given) - set(net.input_names))
    if unknown:
        raise LayerParamError(
            f"unknown input blob(s) {unknown}", path=net.path, expected=net.input_names
        )
    out = {}
    for name in net.input_names:
        if name in given:
            out[name] = np.ascontiguousarray(given[name], dtype=np.float32)
        else:
            shape = net.blob_shapes[name]
            out[name] = rng.uniform(-1, 1, shape).astype(np.float32)
    return out


# -- torchcaffe side -------------------------------------------------------------------------
@torch.no_grad()
def torchcaffe_layer_tops(
    net: TorchNet, inputs: Mapping[str, np.ndarray]
) -> list[tuple[str, str, str, np.ndarray]]:
    """(layer, type, top, value right after the layer ran) for every non-input layer."""
    blobs = net.bind_inputs([], {k: torch.from_numpy(v) for k, v in inputs.items()})
    rows = []
    for step in net.steps:
        if step.is_input:
            continue
        tops = net.run_step(step, [blobs[b] for b in step.bottoms])
        blobs.update(zip(step.tops, tops))
        for name, value in zip(step.tops, tops):
            rows.append((step.name, step.type, name, value.detach().cpu().numpy().copy()))
    return rows


# -- other engines: {(layer, top): array} --------------------------------------------------
OtherRun = Callable[[PathLike, PathLike, TorchNet, Mapping[str, np.ndarray]], dict]


def run_opencv(prototxt, weights, net, inputs) -> dict[tuple[str, str], np.ndarray]:
    try:
        import cv2
    except ImportError:
        raise MissingPackageError(
            "--against opencv needs OpenCV", hint="pip install torchcaffe[opencv]"
        ) from None
    if not hasattr(cv2.dnn, "readNetFromCaffe"):
        raise UnsupportedError(
            f"OpenCV {cv2.__version__} has no Caffe importer (removed in OpenCV 5)",
            hint="pip install 'opencv-python-headless<5' (torchcaffe[opencv])",
        )
    cv = cv2.dnn.readNetFromCaffe(os.fspath(prototxt), os.fspath(weights))
    cv.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    cv.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
    cv.enableFusion(False)  # keep BatchNorm/Scale/ReLU outputs apart from the conv's
    for name, value in inputs.items():
        cv.setInput(value, name)
    known = set(cv.getLayerNames())
    # a layer without tops (Silence) has nothing to compare
    wanted = [s.name for s in net.steps if not s.is_input and s.tops and s.name in known]
    outs = cv.forward(wanted) if wanted else []
    return {(layer, net.step(layer).tops[0]): np.asarray(o) for layer, o in zip(wanted, outs)}


def run_onnxruntime(
    prototxt, weights, net, inputs, dynamo: bool = False
) -> dict[tuple[str, str], np.ndarray]:
    try:
        import onnxruntime as ort
    except ImportError:
        raise MissingPackageError(
            "--against onnxruntime needs onnxruntime", hint="pip install torchcaffe[onnx]"
        ) from None
    import tempfile

    from .onnx import export_onnx

    steps = _traceable_prefix(net)
    pairs = [(s.name, t) for s in steps if not s.is_input for t in s.tops]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "net.onnx")
        export_onnx(
            _EveryTop(net, steps, pairs),  # type: ignore[arg-type]
            path,
            dynamo=dynamo,
            dynamic_batch=False,
            input_shapes={k: v.shape for k, v in inputs.items()},
        )
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        outs = sess.run(None, dict(inputs))
    return dict(zip(pairs, outs))


def _traceable_prefix(net: TorchNet) -> list[LayerStep]:
    """The steps before the first layer whose tops' sizes depend on the values (an SSD's
    DetectionOutput): a trace would keep the example's sizes, so onnxruntime is compared
    on the layers before it, and the warning says where it stopped."""
    steps = list(net.steps)
    found = net.first_value_shaped(steps)
    if found is None:
        return steps
    step = steps[found]
    warnings.warn(
        f"onnxruntime compared up to layer {step.name!r} ({step.type}), whose tops' "
        "sizes depend on the values: an ONNX trace cannot record it",
        stacklevel=2,
    )
    return steps[:found]


class _EveryTop(torch.nn.Module):
    """A TorchNet look-alike for export_onnx whose outputs are every layer's tops, each as
    it was right after its layer ran (in-place layers would otherwise show the last value)."""

    def __init__(
        self, net: TorchNet, steps: Sequence[LayerStep], pairs: Sequence[tuple[str, str]]
    ) -> None:
        super().__init__()
        self.inner, self.steps = net, list(steps)
        self.pairs = list(pairs)
        self.path, self.name, self.phase = net.path, net.name, net.phase
        self.input_names = net.input_names
        self.blob_shapes = {**net.blob_shapes, **{f"{a}/{b}": () for a, b in self.pairs}}
        self.output_names = [f"{a}/{b}" for a, b in self.pairs]

    def run(self, blobs: dict) -> dict:
        for step in self.steps:
            if step.is_input:
                continue
            tops = self.inner.run_step(step, [blobs[b] for b in step.bottoms])
            blobs.update(zip(step.tops, tops))
            for top, value in zip(step.tops, tops):
                blobs[f"{step.name}/{top}"] = value.clone()
        return blobs


def run_caffe(prototxt, weights, net, inputs) -> dict[tuple[str, str], np.ndarray]:
    caffe = reference_pycaffe()
    ref = caffe.Net(os.fspath(prototxt), os.fspath(weights), net.phase)
    for name, value in inputs.items():
        ref.blobs[name].reshape(*value.shape)
        ref.blobs[name].data[...] = value
    out = {}
    for layer in ref._layer_names:
        ref.forward(start=layer, end=layer)
        for top in ref.top_names[layer]:
            out[(layer, top)] = np.array(ref.blobs[top].data, copy=True)
    return out


def reference_pycaffe():
    """The real pycaffe (BVLC's ``caffe`` with its C++ ``_caffe``), never torchcaffe's shim."""
    try:
        import caffe  # type: ignore[import-not-found]
    except ImportError:
        caffe = None
    real = (
        caffe is not None
        and hasattr(caffe, "_caffe")
        and "torchcaffe" not in str(getattr(caffe, "__file__", ""))
    )
    if not real:
        raise UnsupportedError(
            "--against caffe needs a reference pycaffe (BVLC Caffe's python module) on "
            "PYTHONPATH; `import caffe` found none"
            + ("" if caffe is None else f" (found {getattr(caffe, '__file__', caffe)!r})"),
            hint="build Caffe with pycaffe, or compare --against opencv / onnxruntime",
        )
    return caffe


ENGINE_RUNS: dict[str, OtherRun] = {
    "opencv": run_opencv,
    "onnxruntime": run_onnxruntime,
    "onnxruntime-dynamo": functools.partial(run_onnxruntime, dynamo=True),
    "caffe": run_caffe,
}


# -- the comparison ---------------------------------------------------------------------------
def diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(max |a - b|, that over max |b|); NaN where only one side has it counts as infinite."""
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a != nan_b).any():
        return math.inf, math.inf
    keep = ~nan_a
    a64, b64 = a[keep].astype(np.float64), b[keep].astype(np.float64)
    if a64.size == 0:
        return 0.0, 0.0
    max_abs = float(np.abs(a64 - b64).max())
    scale = float(np.abs(b64).max())
    return max_abs, (max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf))


def compare(
    prototxt: PathLike,
    weights: PathLike,
    against: str,
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    phase: str = "test",
    tolerance: float = 1e-4,
    seed: int = 0,
    other_weights: PathLike | None = None,
) -> Comparison:
    """Every layer's tops in torchcaffe vs ``against``; the first beyond ``tolerance``.

    ``other_weights`` gives the other engine a different caffemodel (e.g. the original of a
    re-saved or edited one), to find the first layer the difference shows in.
    """
    if against not in ENGINE_RUNS:
        raise UnsupportedError(f"unknown engine {against!r}", expected=ENGINES, got=against)
    net = load(prototxt, weights, phase).eval()
    feed = make_inputs(net, inputs, seed)
    ours = torchcaffe_layer_tops(net, feed)
    theirs = ENGINE_RUNS[against](prototxt, other_weights or weights, net, feed)
    result = Comparison(against, tolerance)
    declared = {lp.name for lp in net.net_param.layer}  # not the Split layers Caffe inserts
    for layer, type_, top, value in ours:
        if layer not in declared:
            continue
        other = theirs.get((layer, top))
        if other is None:
            result.skipped.append(f"{layer}/{top}")
            continue
        other = np.asarray(other)
        same_size = other.size == value.size
        if same_size:
            max_abs, max_rel = diff(value.reshape(-1), other.reshape(-1))
        else:
            max_abs = max_rel = math.inf
        result.rows.append(
            BlobDiff(
                layer,
                type_,
                top,
                tuple(value.shape),
                tuple(other.shape),
                max_abs,
                max_rel,
                same_size and max_rel <= tolerance,
            )
        )
    return result
