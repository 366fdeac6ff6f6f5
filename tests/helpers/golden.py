"""Run one golden case (tests/golden/<group>/<case>) through the Caffe face and compare.

Procedure (golden README): build the net in the case's phase, load weights, write ``in/``,
forward, clear param diffs, write ``topdiff/`` into non-loss outputs, backward; then compare
every blob's data and diff, every param, param diff and updated param within the case's
tolerances. data/ and solvers/ cases run in a writable copy of their folder (as cwd): data
cases compare every top after each forward, solver cases the loss of every step, the final
params and the solverstate history.

``TORCHCAFFE_GOLDEN_MODE=gpu`` runs every case in Caffe's GPU mode (``set_mode_gpu``), with
the same tolerances: the CPU reference's numbers, computed on CUDA. It is opt-in, for a
machine with a GPU (CI has none).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import torchcaffe as caffe

from .compare import assert_blob_close


@dataclass
class Case:
    path: Path
    group: str
    name: str
    meta: dict

    @property
    def id(self) -> str:
        return f"{self.group}/{self.name}"

    def arrays(self) -> dict[str, np.ndarray]:
        with np.load(self.path / "arrays.npz") as z:
            return {k: z[k] for k in z.files}


def discover(root: Path) -> list[Case]:
    cases = []
    for meta_path in sorted(root.glob("*/*/meta.json")):
        meta = json.loads(meta_path.read_text())
        cases.append(
            Case(meta_path.parent, meta_path.parent.parent.name, meta_path.parent.name, meta)
        )
    return cases


class InFolder:
    def __init__(self, path: Path) -> None:
        self.path, self.old = path, None

    def __enter__(self):
        self.old = os.getcwd()
        os.chdir(self.path)

    def __exit__(self, *exc):
        os.chdir(self.old)


# input-fed cases whose axis 0 is the recurrent layers' timesteps, fixed when the net unrolls
RECURRENT_NETS = (
    "layers/lstm_basic",
    "layers/lstm_expose_hidden",
    "layers/lstm_expose_hidden_cont1",
    "layers/lstm_static_input",
    "layers/rnn_basic",
    "layers/rnn_expose_hidden",
    "nets/lstm_net",
)


def input_fed_cases(root: Path) -> list[Case]:
    """The layers/, forks/ and nets/ cases whose ``in/`` arrays are exactly their net's input
    blobs (the others read data layers too)."""
    cases = []
    for case in discover(root):
        if case.group not in ("layers", "forks", "nets"):
            continue
        with np.load(case.path / "arrays.npz") as arrays:
            fed = sorted(k[3:] for k in arrays.files if k.startswith("in/"))
        with InFolder(case.path):
            inputs = caffe.load(str(case.path / "net.prototxt"), phase="test").input_names
        if fed and fed == sorted(inputs):
            cases.append(case)
    return cases


def case_net(case: Case, phase: str = "test") -> caffe.TorchNet:
    """The case's net in ``phase`` (torch face), with its weights where it has them; call it
    inside ``InFolder(case.path)`` (some nets name files relative to their folder)."""
    weights = case.path / "weights.caffemodel"
    args = [str(case.path / "net.prototxt")] + ([str(weights)] if weights.exists() else [])
    return caffe.load(*args, phase=phase)


def case_inputs(case: Case) -> dict[str, torch.Tensor]:
    """The case's ``in/`` arrays, by blob name."""
    return {k[3:]: torch.from_numpy(v) for k, v in case.arrays().items() if k[:3] == "in/"}


def twice_the_batch(
    inputs: dict[str, torch.Tensor], symbolic: Collection[str]
) -> dict[str, torch.Tensor]:
    """``inputs`` with axis 0 of those named ``symbolic`` doubled (by a flipped, halved copy:
    other values than the first half's), the rest as they are."""
    return {
        k: torch.cat([v, v.flip(0) * 0.5 if v.is_floating_point() else v.flip(0)])
        if k in symbolic
        else v
        for k, v in inputs.items()
    }


def golden_mode() -> str:
    """The Caffe mode the cases run in: ``cpu`` (the default) or ``gpu``."""
    mode = os.environ.get("TORCHCAFFE_GOLDEN_MODE", "cpu").lower()
    if mode not in ("cpu", "gpu"):
        raise ValueError(f"TORCHCAFFE_GOLDEN_MODE={mode!r}: expected cpu or gpu")
    return mode


def _enter_mode() -> None:
    if golden_mode() == "gpu":
        caffe.set_mode_gpu()


def _phase(meta: dict) -> int:
    return caffe.TRAIN if meta["phase"] == "TRAIN" else caffe.TEST


def run_blob_case(case: Case) -> None:
    """layers/, nets/, forks/: every blob data/diff, param, param diff."""
    _enter_mode()
    meta, arrays = case.meta, case.arrays()
    rtol, atol = meta["rtol"], meta["atol"]
    weights = case.path / "weights.caffemodel"
    with InFolder(case.path):
        net = caffe.Net(
            str(case.path / "net.prototxt"),
            _phase(meta),
            weights=str(weights) if weights.exists() else None,
        )
        for key, value in arrays.items():
            if key.startswith("param/"):
                _, layer, i = key.split("/")
                assert_blob_close(key, net.params[layer][int(i)].data, value, rtol, atol)
        for key, value in arrays.items():
            if key.startswith("in/"):
                name = key[3:]
                net.blobs[name].reshape(*value.shape)
                net.blobs[name].data[...] = value
        net.forward()
        if meta.get("deterministic", True) is False:
            RELATIONS[case.name](net, arrays, meta)
            return
        for key, value in arrays.items():
            if key.startswith("out/"):
                assert_blob_close(key, net.blobs[key[4:]].data, value, rtol, atol)
            elif key.startswith("paramafter/"):
                _, layer, i = key.split("/")
                assert_blob_close(key, net.params[layer][int(i)].data, value, rtol, atol)
        if not meta["backward"]:
            return
        net.clear_param_diffs()
        for key, value in arrays.items():
            if key.startswith("topdiff/"):
                net.blobs[key[8:]].diff[...] = value
        net.backward()
        for key, value in arrays.items():
            if key.startswith("diff/"):
                assert_blob_close(key, net.blobs[key[5:]].diff, value, rtol, atol)
            elif key.startswith("paramdiff/"):
                _, layer, i = key.split("/")
                assert_blob_close(key, net.params[layer][int(i)].diff, value, rtol, atol)


def run_legacy_case(case: Case) -> None:
    """legacy/: the legacy files and the upgraded files give the recorded outputs."""
    _enter_mode()
    meta, arrays = case.meta, case.arrays()
    rtol, atol = meta["rtol"], meta["atol"]
    pairs = [
        (meta["source_prototxt"], meta["weights"]),
        (meta["upgraded_prototxt"], meta["upgraded_weights"]),
    ]
    for proto, weights in pairs:
        net = caffe.Net(str(case.path / proto), str(case.path / weights), _phase(meta))
        for key, value in arrays.items():
            if key.startswith("param/"):
                _, layer, i = key.split("/")
                assert_blob_close(
                    f"{proto}: {key}", net.params[layer][int(i)].data, value, rtol, atol
                )
            elif key.startswith("in/"):
                net.blobs[key[3:]].reshape(*value.shape)
                net.blobs[key[3:]].data[...] = value
        net.forward()
        for key, value in arrays.items():
            if key.startswith("out/"):
                assert_blob_close(f"{proto}: {key}", net.blobs[key[4:]].data, value, rtol, atol)


def _writable_copy(case: Case) -> tempfile.TemporaryDirectory:
    """A scratch copy of the case folder: cases run with it as cwd (DB readers write locks)."""
    tmp = tempfile.TemporaryDirectory(prefix=f"golden-{case.group}-{case.name}-")
    shutil.copytree(case.path, Path(tmp.name) / case.name)
    return tmp


def run_data_case(case: Case) -> None:
    """data/: build the net in a writable copy of the case, forward ``batches`` times and
    compare every top after each forward."""
    _enter_mode()
    meta, arrays = case.meta, case.arrays()
    rtol, atol = meta["rtol"], meta["atol"]
    with _writable_copy(case) as tmp, InFolder(Path(tmp) / case.name):
        net = caffe.Net("net.prototxt", _phase(meta))
        if meta.get("feed") == "set_input_arrays":
            net.set_input_arrays(arrays["in/data"], arrays["in/label"])
        for k in range(meta["batches"]):
            net.forward()
            for top in meta["tops"]:
                key = f"batch{k}/{top}"
                assert_blob_close(key, net.blobs[top].data, arrays[key], rtol, atol)


def run_solver_case(case: Case) -> None:
    """solvers/: train from weights.caffemodel step by step in a writable copy of the case;
    compare the loss of every step, the final params, and the history and counters of the
    solverstate we write; then restore Caffe's own final.solverstate into a fresh solver."""
    _enter_mode()
    from torchcaffe.solver import read_solverstate

    meta, arrays = case.meta, case.arrays()
    rtol, atol = meta["rtol"], meta["atol"]
    with _writable_copy(case) as tmp, InFolder(Path(tmp) / case.name):
        solver = caffe.get_solver("solver.prototxt")
        assert solver.type == meta["solver_type"], (solver.type, meta["solver_type"])
        solver.net.copy_from("weights.caffemodel")
        _check_params(solver.net, arrays, "param_init/", rtol, atol)
        for i in range(meta["iterations"]):
            solver.step(1)
            assert_blob_close(
                f"loss/{i}", solver.net.blobs["loss"].data, arrays[f"loss/{i}"], rtol, atol
            )
        _check_params(solver.net, arrays, "param/", rtol, atol)
        mine, caffes = read_solverstate(solver.snapshot()), read_solverstate("final.solverstate")
        assert (mine.iter, mine.current_step) == (caffes.iter, caffes.current_step)
        _check_history(mine.history, arrays, rtol, atol)
        fresh = caffe.get_solver("solver.prototxt")
        fresh.restore("final.solverstate")
        assert fresh.iter == caffes.iter
        _check_params(fresh.net, arrays, "param/", rtol, atol)
        history = fresh.optimizer.history_blobs([e.tensor for e in fresh._learnables])
        _check_history([h.cpu().numpy() for h in history], arrays, rtol, atol)


def _check_params(net, arrays, prefix: str, rtol: float, atol: float) -> None:
    for key, value in arrays.items():
        if key.startswith(prefix):
            _, layer, i = key.split("/")
            assert_blob_close(key, net.params[layer][int(i)].data, value, rtol, atol)


def _check_history(history, arrays, rtol: float, atol: float) -> None:
    want = sorted(
        (k for k in arrays if k.startswith("history/")), key=lambda k: int(k.split("/")[1])
    )
    assert len(history) == len(want), f"{len(history)} history blobs, expected {len(want)}"
    for key, blob in zip(want, history):
        assert_blob_close(key, blob, arrays[key], rtol, atol)


def _dropout_relations(net, arrays, meta) -> None:
    """dropout_train: y is 0 or x/(1-p); zero fraction ~ p; diff = topdiff*(y!=0)/(1-p)."""
    ratio = net.layers[-1].module.param.dropout_ratio
    x, y = net.blobs["x"].data.copy(), net.blobs["y"].data.copy()
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / (1 - ratio), rtol=meta["rtol"], atol=meta["atol"])
    frac = 1 - kept.mean()
    assert abs(frac - ratio) < 0.15, f"dropped fraction {frac:.3f} far from {ratio}"
    net.blobs["y"].diff[...] = arrays["topdiff/y"]
    net.backward()
    want = arrays["topdiff/y"] * kept / (1 - ratio)
    np.testing.assert_allclose(net.blobs["x"].diff, want, rtol=meta["rtol"], atol=meta["atol"])


RELATIONS = {"dropout_train": _dropout_relations}

RUNNERS = {
    "layers": run_blob_case,
    "nets": run_blob_case,
    "forks": run_blob_case,
    "legacy": run_legacy_case,
    "data": run_data_case,
    "solvers": run_solver_case,
}
