"""``debug_info: true``: the per-layer lines Caffe's Net logs (ForwardDebugInfo,
BackwardDebugInfo, Backward's norms), their values checked against numpy, and when the
solver turns them on (display iterations for the train net, always for test nets)."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe.cli.__main__ import main

NET = """
name: "tiny"
debug_info: DEBUG
layer { name: "data" type: "Input" top: "data" top: "target"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        param { name: "w1" } param { lr_mult: 0 }
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 }
                              bias_filler { type: "constant" value: 0.25 } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip1" bottom: "target" top: "loss" }
"""
LINE = re.compile(r"    \[(Forward|Backward)\] (.*): (\S+)$")


def _net(tmp_path, debug: bool = True) -> caffe.Net:
    path = tmp_path / "net.prototxt"
    path.write_text(NET.replace("DEBUG", str(debug).lower()))
    net = caffe.Net(str(path), caffe.TRAIN)
    rng = np.random.default_rng(0)
    net.blobs["data"].data[...] = rng.standard_normal((4, 3))
    net.blobs["target"].data[...] = rng.standard_normal((4, 2))
    return net


def _mean_abs(a: np.ndarray) -> float:
    a = np.asarray(a, np.float32)
    return float(np.abs(a).sum(dtype=np.float32) / np.float32(a.size))


def _parsed(caplog) -> list[tuple[str, str, float]]:
    out = []
    for r in caplog.records:
        m = LINE.match(r.getMessage())
        if m and r.name == "torchcaffe.solver":
            out.append((m[1], m[2], float(m[3])))
    return out


def _expected(net: caffe.Net) -> list[tuple[str, str, float]]:
    """Caffe's lines for this net, from numpy: the Input's and each layer's tops, the params
    by ParamSpec name or index; backward: the bottoms that need it and lr_mult != 0 params."""
    x, t = net.blobs["data"].data, net.blobs["target"].data
    w, b = net.params["ip1"][0].data, net.params["ip1"][1].data
    ip = x @ w.T + b
    relu = np.maximum(ip, 0)
    n = len(x)
    d_relu = (relu - t) / n
    d_ip = d_relu * (ip > 0)
    return [
        ("Forward", "Layer data, top blob data data", _mean_abs(x)),
        ("Forward", "Layer data, top blob target data", _mean_abs(t)),
        ("Forward", "Layer ip1, top blob ip1 data", _mean_abs(ip)),
        ("Forward", "Layer ip1, param blob w1 data", _mean_abs(w)),
        ("Forward", "Layer ip1, param blob 1 data", _mean_abs(b)),
        ("Forward", "Layer relu, top blob ip1 data", _mean_abs(relu)),
        ("Forward", "Layer loss, top blob loss data", float(((relu - t) ** 2).sum() / 2 / n)),
        ("Backward", "Layer loss, bottom blob ip1 diff", _mean_abs(d_relu)),
        ("Backward", "Layer relu, bottom blob ip1 diff", _mean_abs(d_ip)),
        ("Backward", "Layer ip1, param blob 0 diff", _mean_abs(d_ip.T @ x)),
    ]


def _check(got, expected) -> None:
    assert [g[:2] for g in got] == [e[:2] for e in expected]
    np.testing.assert_allclose([g[2] for g in got], [e[2] for e in expected], rtol=2e-5)


def test_forward_and_backward_log_each_layer_as_caffe(tmp_path, caplog):
    net = _net(tmp_path)
    with caplog.at_level(logging.INFO, "torchcaffe.solver"):
        net.forward()
        net.backward()
    _check(_parsed(caplog), _expected(net))
    # values print as Caffe streams a float: 6 significant digits
    first = caplog.records[0].getMessage()
    assert first == f"    [Forward] Layer data, top blob data data: {_expected(net)[0][2]:g}"
    assert not any(r.levelno == logging.ERROR for r in caplog.records)  # BackwardFromTo only


def test_forward_backward_ends_with_the_param_norms(tmp_path, caplog):
    net = _net(tmp_path)
    net.clear_param_diffs()
    with caplog.at_level(logging.INFO, "torchcaffe.solver"):
        net.forward_backward()
    _check(_parsed(caplog), _expected(net))
    w, b = net.params["ip1"][0], net.params["ip1"][1]
    data = np.concatenate([w.data.ravel(), b.data.ravel()])
    diff = np.concatenate([w.diff.ravel(), b.diff.ravel()])
    last = caplog.records[-1]
    assert last.levelno == logging.ERROR
    m = re.fullmatch(
        r"    \[Backward\] All net params \(data, diff\): "
        r"L1 norm = \((\S+), (\S+)\); L2 norm = \((\S+), (\S+)\)",
        last.getMessage(),
    )
    assert m is not None
    expected = [np.abs(data).sum(), np.abs(diff).sum(), np.sqrt((data**2).sum()), 0.0]
    expected[3] = np.sqrt((diff**2).sum())
    np.testing.assert_allclose([float(v) for v in m.groups()], expected, rtol=2e-5)


def test_off_logs_nothing(tmp_path, caplog):
    net = _net(tmp_path, debug=False)
    with caplog.at_level(logging.INFO, "torchcaffe.solver"):
        net.forward()
        net.backward()
        net.forward_backward()
    assert not caplog.records


SOLVER = """net: "net.prototxt"
test_net: "net.prototxt"
test_iter: 1
test_interval: 100
base_lr: 0.01
lr_policy: "fixed"
display: 2
max_iter: 3
random_seed: 1
snapshot_after_train: false
debug_info: true
"""


def test_solver_logs_display_iterations_and_every_test_forward(tmp_path, monkeypatch, caplog):
    """Caffe's Step sets the train net's debug_info to ``display && debug_info`` each
    iteration (the net's own flag is overruled); InitTestNets sets the test nets' to the
    solver's."""
    monkeypatch.chdir(tmp_path)
    _net(tmp_path, debug=False)
    (tmp_path / "solver.prototxt").write_text(SOLVER)
    solver = caffe.get_solver("solver.prototxt")
    with caplog.at_level(logging.INFO, "torchcaffe.solver"):
        solver.step(3)
    messages = [r.getMessage() for r in caplog.records]
    iterations = [m for m in messages if m.startswith("Iteration") and "lr =" in m]
    assert len(iterations) == 2  # iterations 0 and 2 display
    forwards = [m for m in messages if m.startswith("    [Forward] Layer loss")]
    # the test at iteration 0, then the two display iterations' train forwards
    assert len(forwards) == 3
    norms = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(norms) == 2  # iteration 1 logs none


@pytest.mark.parametrize("debug", [True, False])
def test_train_cli_logs_the_lines_in_glog_format(tmp_path, monkeypatch, capsys, debug):
    monkeypatch.chdir(tmp_path)
    _net(tmp_path, debug=False)
    text = SOLVER.replace("debug_info: true", f"debug_info: {str(debug).lower()}")
    (tmp_path / "solver.prototxt").write_text(text)
    assert main(["train", "-solver", "solver.prototxt"]) == 0
    err = capsys.readouterr().err
    glog = r"[IE]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+:\d+\] "
    forward = re.findall(glog + r"    \[Forward\] Layer ip1, param blob w1 data: \S+\n", err)
    norms = re.findall(r"E\d{4} .*\]     \[Backward\] All net params", err)
    assert (len(forward), len(norms)) == ((3, 2) if debug else (0, 0))
