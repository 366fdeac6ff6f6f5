"""Resuming is bitwise: k iterations, a snapshot, a fresh solver restored from it and n-k more
iterations give exactly the n-iteration weights and history, for every update rule and both
snapshot formats. And a snapshot killed mid-write leaves the previous one whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe.formats.atomic import TEMP_MARK

RULES = {
    "SGD": "momentum: 0.9",
    "Nesterov": "momentum: 0.9",
    "AdaGrad": "delta: 1e-6",
    "RMSProp": "rms_decay: 0.95 delta: 1e-6",
    "AdaDelta": "momentum: 0.9 delta: 1e-6",
    "Adam": "momentum: 0.9 momentum2: 0.999 delta: 1e-8",
}
K, N = 4, 7  # k even: 8 rows at batch 4 put the data reader back at row 0, as after a restore


def state(solver):
    params = [b.data.copy() for blobs in solver.net.params.values() for b in blobs]
    tensors = [e.tensor for e in solver._learnables]
    history = [h.numpy() for h in solver.optimizer.history_blobs(tensors)]
    return params, history


@pytest.mark.parametrize("fmt", ["BINARYPROTO", "HDF5"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_snapshot_restore_continue_is_bitwise(setup, rule, fmt):
    lr = 1.0 if rule == "AdaDelta" else 0.05
    body = (
        f'type: "{rule}" base_lr: {lr} {RULES[rule]} weight_decay: 0.01 '
        f'lr_policy: "step" gamma: 0.5 stepsize: 3 snapshot_prefix: "snap" snapshot_format: {fmt}'
    )
    name = setup.solver(body)
    straight = caffe.get_solver(name)
    straight.step(N)
    first = caffe.get_solver(name)
    first.step(K)
    saved = first.snapshot()
    resumed = caffe.get_solver(name)
    resumed.restore(saved)
    assert resumed.iter == K
    resumed.step(N - K)
    (want_params, want_history), (got_params, got_history) = state(straight), state(resumed)
    assert len(got_history) == len(want_history) > 0
    for got, want in zip(got_params + got_history, want_params + want_history):
        np.testing.assert_array_equal(got, want)
    assert resumed.lr == straight.lr and resumed.iter == straight.iter == N


WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from torchcaffe.solver.state import SolverSnapshot, write_solverstate

    big = [np.full((4_000_000,), float(i), np.float32) for i in range(4)]  # 64 MB a file
    write_solverstate("snap.solverstate", SolverSnapshot(1, 0, "first.caffemodel", big))
    print("first", flush=True)
    i = 2
    while True:  # rewrite the same file until killed
        write_solverstate("snap.solverstate", SolverSnapshot(i, 0, "later.caffemodel", big))
        i += 1
    """
)


def test_kill_9_during_snapshots_leaves_the_previous_one_loadable(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "first"
        # Kill while a rewrite is under way: its temporary sibling exists (atomic_write).
        deadline = time.monotonic() + 60
        mid_write = False
        while not mid_write and time.monotonic() < deadline:
            mid_write = any(TEMP_MARK in p.name for p in tmp_path.iterdir())
        os.kill(proc.pid, signal.SIGKILL)
        assert mid_write, "the writer never started a second snapshot"
    finally:
        proc.kill()
        proc.wait()
    snap = caffe.solver.read_solverstate(tmp_path / "snap.solverstate")
    assert snap.learned_net in ("first.caffemodel", "later.caffemodel")
    assert len(snap.history) == 4
    for i, blob in enumerate(snap.history):
        assert blob.size == 4_000_000 and blob.min() == blob.max() == i


SOLVING = textwrap.dedent(
    """
    import torchcaffe as caffe

    solver = caffe.get_solver("solver.prototxt")
    solver.step(1)  # snapshot 1 written whole
    print("first", flush=True)
    while True:  # snapshot every iteration until killed
        solver.step(1)
    """
)


def test_kill_9_during_solver_snapshots_leaves_every_visible_snapshot_restorable(setup):
    """A real Solver snapshotting every iteration (a 36 MB model, so writes take a while) is
    killed while a snapshot file is being written: every .caffemodel and .solverstate left
    under its name is whole, and the newest state restores into a fresh solver."""
    big = setup.root / "big.prototxt"
    big.write_text(
        (setup.root / "train.prototxt")
        .read_text()
        .replace('top: "ip1"\n', 'top: "wide"\n', 1)
        .replace(
            'layer { name: "relu"',
            'layer { name: "wide_ip" type: "InnerProduct" bottom: "wide" top: "ip1"\n'
            "        inner_product_param { num_output: 4 } }\n"
            'layer { name: "relu"',
        )
        .replace("num_output: 4 weight_filler", "num_output: 1000000 weight_filler", 1)
    )
    name = setup.solver(
        'type: "SGD" base_lr: 0.0 lr_policy: "fixed" snapshot: 1 snapshot_prefix: "snap"',
        net="big.prototxt",
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", SOLVING], cwd=setup.root, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "first"
        deadline = time.monotonic() + 120
        mid_write = False
        while not mid_write and time.monotonic() < deadline:
            mid_write = any(TEMP_MARK in p.name for p in setup.root.iterdir())
        os.kill(proc.pid, signal.SIGKILL)
        assert mid_write, "the solver never started a second snapshot"
    finally:
        proc.kill()
        proc.wait()
    states = sorted(setup.root.glob("snap_iter_*.solverstate"), key=lambda p: p.stat().st_mtime)
    models = list(setup.root.glob("snap_iter_*.caffemodel"))
    assert states and models
    net = caffe.Net(str(big), caffe.TRAIN)
    for model in models:
        net.copy_from(str(model))  # whole: a torn file would not parse
    for state in states:
        assert caffe.solver.read_solverstate(state).learned_net.startswith("snap_iter_")
    resumed = caffe.get_solver(name)
    resumed.restore(str(states[-1]))
    assert resumed.iter == int(states[-1].stem.split("_")[-1])
