"""Bad solver files and states: a TorchCaffeError naming the file and the field, raised before
any training (where Caffe would abort with a CHECK, some only at the first update)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe.errors import (
    PrototxtError,
    SolverError,
    TorchCaffeError,
    UnsupportedError,
    WeightsError,
)
from torchcaffe.solver import SolverSnapshot, write_solverstate

OK = 'type: "SGD" base_lr: 0.1 lr_policy: "fixed"'


@pytest.mark.parametrize(
    "body,field",
    [
        ('type: "Sgd" base_lr: 0.1 lr_policy: "fixed"', "type"),
        ('type: "SGD" base_lr: 0.1', "lr_policy"),
        ('type: "SGD" base_lr: 0.1 lr_policy: "cosine"', "lr_policy"),
        ('type: "SGD" base_lr: 0.1 lr_policy: "step" gamma: 0.1', "stepsize"),
        ('type: "SGD" base_lr: 0.1 lr_policy: "sigmoid" gamma: 0.1', "stepsize"),
        ('type: "SGD" base_lr: 0.1 lr_policy: "exp" gamma: -0.5', "gamma"),
        ('type: "SGD" base_lr: 0.1 lr_policy: "poly" power: 2', "max_iter"),
        ('type: "AdaGrad" base_lr: 0.1 lr_policy: "fixed" momentum: 0.9', "momentum"),
        ('type: "RMSProp" base_lr: 0.1 lr_policy: "fixed" rms_decay: 1.0', "rms_decay"),
        (f"{OK} average_loss: 0", "average_loss"),
        (f"{OK} iter_size: 0", "iter_size"),
        (f'{OK} weight_decay: 0.1 regularization_type: "L3"', "regularization_type"),
        (f"{OK} test_iter: 1", "test_interval"),
        (f"{OK} test_iter: 1 test_interval: 5 test_state {{ }} test_state {{ }}", "test_state"),
    ],
)
def test_bad_field_names_file_and_field(setup, body, field):
    name = setup.solver(body)
    with pytest.raises(SolverError, match=rf"^{name}: field '{field}'"):
        caffe.get_solver(name)


def test_regularization_type_is_unused_without_weight_decay(setup):
    caffe.get_solver(setup.solver(f'{OK} regularization_type: "L3"'))


def test_plateau_policy_is_unsupported(setup):
    name = setup.solver('type: "SGD" base_lr: 0.1 lr_policy: "plateau" gamma: 0.1')
    with pytest.raises(UnsupportedError, match=r"field 'lr_policy'.*plateau"):
        caffe.get_solver(name)


def test_train_net_must_be_given_exactly_once(setup):
    (setup.root / "none.prototxt").write_text(OK)
    with pytest.raises(SolverError, match=r"none\.prototxt: .*exactly one train net.*got none"):
        caffe.get_solver("none.prototxt")
    (setup.root / "two.prototxt").write_text(f'{OK} net: "a" train_net: "b"')
    with pytest.raises(SolverError, match="got net, train_net"):
        caffe.get_solver("two.prototxt")


def test_test_net_without_test_iter(setup):
    (setup.root / "s.prototxt").write_text(
        f'{OK} train_net: "train.prototxt" test_net: "train.prototxt"'
    )
    with pytest.raises(SolverError, match=r"field 'test_iter'.*expected 1, got 0"):
        caffe.get_solver("s.prototxt")


def test_missing_net_file_hints_at_the_working_directory(setup, tmp_path, monkeypatch):
    sub = setup.root / "model"
    sub.mkdir()
    (sub / "train.prototxt").write_text("name: 'x'")
    (sub / "solver.prototxt").write_text(f'{OK} net: "train.prototxt"')
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    with pytest.raises(
        SolverError,
        match=r"solver\.prototxt: field 'net': file "
        r"'train\.prototxt' not found.*run from .*model",
    ):
        caffe.get_solver(sub / "solver.prototxt")


def test_missing_weights_file(setup):
    with pytest.raises(SolverError, match="field 'weights'.*nope.caffemodel"):
        caffe.get_solver(setup.solver(f"{OK} weights: 'nope.caffemodel'"))


def test_parse_error_carries_line_and_column(setup):
    (setup.root / "bad.prototxt").write_text(f"{OK}\nmomentm: 0.9\n")
    with pytest.raises(PrototxtError, match=r"bad\.prototxt:2:1.*momentm"):
        caffe.get_solver("bad.prototxt")


def test_old_and_new_type_fields_together(setup):
    with pytest.raises(SolverError, match="solver_type.*type"):
        caffe.get_solver(setup.solver(f"{OK} solver_type: ADAM"))


def test_unwritable_snapshot_prefix(setup):
    name = setup.solver(f"{OK} snapshot: 5 snapshot_prefix: 'no/such/dir/x'")
    with pytest.raises(SolverError, match="field 'snapshot_prefix'.*no/such/dir"):
        caffe.get_solver(name)


def test_an_unwritable_prefix_for_the_snapshot_after_train_fails_solve_before_training(setup):
    """snapshot_after_train (true by default) writes after the last step: solve() checks the
    prefix first instead of failing after the whole run; a script that only steps, which
    never writes it, is not stopped (Caffe checks only for ``snapshot`` at construction)."""
    name = setup.solver(f"{OK} max_iter: 3 snapshot_prefix: 'no/such/dir/x'")
    text = (setup.root / name).read_text().replace("snapshot_after_train: false", "")
    (setup.root / name).write_text(text)  # Caffe's default: true
    solver = caffe.get_solver(name)
    solver.step(1)
    with pytest.raises(SolverError, match="field 'snapshot_prefix'.*no/such/dir"):
        solver.solve()
    assert solver.iter == 1


def test_restore_checks_the_history_count_and_shapes(setup):
    solver = caffe.get_solver(setup.solver('type: "Adam" base_lr: 0.01 lr_policy: "fixed"'))
    write_solverstate("sgd.solverstate", SolverSnapshot(3, 0, None, [np.zeros(1)] * 4))
    with pytest.raises(
        SolverError,
        match=r"sgd\.solverstate: incorrect number of history "
        r"blobs; expected 8, got 4",
    ):
        solver.restore("sgd.solverstate")
    shapes = [
        np.zeros(t.shape)
        for t in solver.optimizer.history_blobs([e.tensor for e in solver._learnables])
    ]
    shapes[5] = np.zeros(3)
    write_solverstate("bad.solverstate", SolverSnapshot(3, 0, None, shapes))
    with pytest.raises(SolverError, match="history blob 5 does not fit"):
        solver.restore("bad.solverstate")
    with pytest.raises(SolverError, match="not found"):
        solver.restore("absent.solverstate")


def test_restore_with_a_missing_learned_net(setup):
    solver = caffe.get_solver(setup.solver(OK))
    blobs = [
        t.numpy() for t in solver.optimizer.history_blobs([e.tensor for e in solver._learnables])
    ]
    write_solverstate("s.solverstate", SolverSnapshot(1, 0, "gone.caffemodel", blobs))
    with pytest.raises(WeightsError, match="gone.caffemodel") as err:
        solver.restore("s.solverstate")
    # the state that names it, and where Caffe looks for it (the working directory)
    assert err.value.path == "s.solverstate" and os.getcwd() in str(err.value)


def test_every_error_is_a_torchcaffe_error():
    for cls in (SolverError, UnsupportedError, PrototxtError, WeightsError):
        assert issubclass(cls, TorchCaffeError)


def test_negative_base_lr_trains_uphill_as_caffe(setup):
    """Caffe checks no sign on base_lr; the file's value was refused by the optimizer's
    construction check, with neither the file nor the field named."""
    moves = []
    for lr in (0.1, -0.1):
        solver = caffe.get_solver(setup.solver(f'type: "SGD" base_lr: {lr} lr_policy: "fixed"'))
        before = solver.net.params["ip2"][0].data.copy()
        solver.step(1)
        assert solver.lr == np.float32(lr)
        moves.append(solver.net.params["ip2"][0].data - before)
    np.testing.assert_allclose(moves[1], -moves[0], rtol=1e-5, atol=1e-7)


def test_step_refuses_a_fractional_iteration_count(setup):
    """pycaffe's ``step(int)`` raises a TypeError for a float; truncating ``step(2.5)`` to two
    iterations would silently train less than asked."""
    solver = caffe.SGDSolver(setup.solver('base_lr: 0.1 lr_policy: "fixed"'))
    for bad in (2.5, 2.0, "2"):
        with pytest.raises(TypeError, match="whole number of iterations"):
            solver.step(bad)
    assert solver.iter == 0
    solver.step(np.int64(2))
    assert solver.iter == 2
