"""The solver as pycaffe's test_solver.py exercises it, through ``import torchcaffe as caffe``."""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe import layers as L

h5py = pytest.importorskip("h5py")


@pytest.fixture
def solver(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f["data"] = rng.standard_normal((20, 3, 4, 5)).astype(np.float32)
        f["label"] = rng.integers(0, 4, 20).astype(np.float32)
    (tmp_path / "d.txt").write_text(f"{path}\n")
    n = caffe.NetSpec()
    n.data, n.label = L.HDF5Data(batch_size=5, source=str(tmp_path / "d.txt"), ntop=2)
    n.ip = L.InnerProduct(n.data, num_output=4, weight_filler=dict(type="gaussian", std=0.1))
    n.loss = L.SoftmaxWithLoss(n.ip, n.label)
    net = tmp_path / "net.prototxt"
    net.write_text(str(n.to_proto()))
    spec = tmp_path / "solver.prototxt"
    spec.write_text(
        f'net: "{net}"\ntest_iter: 2\ntest_interval: 1000\nbase_lr: 0.01\nmomentum: 0.9\n'
        'weight_decay: 0.0005\nlr_policy: "inv"\ngamma: 0.0001\npower: 0.75\ndisplay: 100\n'
        f'max_iter: 100\nsnapshot_after_train: false\nsnapshot_prefix: "{tmp_path}/model"\n'
    )
    return caffe.SGDSolver(str(spec))


def test_solve(solver):
    assert solver.iter == 0
    solver.solve()
    assert solver.iter == 100


def test_apply_update_uses_current_diffs(solver):
    net = solver.net
    data = net.layers[1].blobs[0].data[...].copy()
    net.layers[1].blobs[0].diff[...] = 1
    solver.apply_update()
    assert (data != net.layers[1].blobs[0].data).all()


def test_net_memory_and_test_nets(solver):
    for net in [solver.net] + list(solver.test_nets):
        for blobs in net.params.values():
            for p in blobs:
                assert np.isfinite(p.data).all() and np.isfinite(p.diff).all()
        assert np.isfinite(net.forward()["loss"])


def test_snapshot_and_restore(solver, tmp_path):
    solver.step(3)
    state = solver.snapshot()
    weights = solver.net.params["ip"][0].data.copy()
    solver.step(2)
    solver.restore(state)
    assert solver.iter == 3
    np.testing.assert_array_equal(solver.net.params["ip"][0].data, weights)


def test_setting_param_base_lr_changes_the_next_updates(solver, tmp_path):
    """pycaffe's ``solver.param.base_lr`` has a setter, and Caffe's GetLearningRate reads it
    on every update: a script that lowers it between steps gets the new rate at once."""
    spec = tmp_path / "step.prototxt"
    net = (tmp_path / "solver.prototxt").read_text().split("\n")[0]  # net: "..."
    spec.write_text(
        f'{net}\nbase_lr: 0.1\nlr_policy: "step"\ngamma: 0.5\nstepsize: 2\nmax_iter: 100\n'
        f'snapshot_after_train: false\nsnapshot_prefix: "{tmp_path}/model"\n'
    )
    s = caffe.SGDSolver(str(spec))  # no momentum, no weight decay: w -= rate * diff
    s.step(3)
    assert s.lr == pytest.approx(0.05)  # 0.1 * 0.5 ** (3 // 2)
    s.param.base_lr = 1.0
    assert s.lr == pytest.approx(0.5)
    blob = s.net.layers[1].blobs[0]
    before = blob.data.copy()
    blob.diff[...] = 1.0
    s.apply_update()
    np.testing.assert_allclose(blob.data, before - 0.5, rtol=1e-6)
    s.step(1)  # iteration 4: 1.0 * 0.5 ** 2
    assert s.lr == pytest.approx(0.25)
