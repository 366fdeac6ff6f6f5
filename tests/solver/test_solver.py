"""The solver loop (Caffe's Solver::Step / Solve): iter_size, snapshots and restore, test
nets, smoothing, callbacks, the pycaffe classes and the solver file's variants."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcaffe as caffe
from torchcaffe.proto import caffe_pb2
from torchcaffe.pycaffe.net import Net
from torchcaffe.solver import read_solverstate
from torchcaffe.solver.solver import STOP

SGD = 'type: "SGD" base_lr: 0.1 lr_policy: "fixed" momentum: 0.9 weight_decay: 0.01'


def params(solver):
    return {k: [b.data.copy() for b in v] for k, v in solver.net.params.items()}


def history(solver):
    return [
        h.numpy() for h in solver.optimizer.history_blobs([e.tensor for e in solver._learnables])
    ]


def test_iter_size_accumulates_like_one_larger_batch(setup):
    """Two batches of 2 with iter_size 2 equal one batch of 4 (losses average per batch)."""
    setup.net(2, "half.prototxt")
    big = caffe.get_solver(setup.solver(f"{SGD} max_iter: 4", "big.prototxt"))
    small = caffe.get_solver(
        setup.solver(f"{SGD} max_iter: 4 iter_size: 2", "small.prototxt", net="half.prototxt")
    )
    big.step(4)
    small.step(4)
    for name, blobs in params(big).items():
        for i, want in enumerate(blobs):
            np.testing.assert_allclose(small.net.params[name][i].data, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "body,fmt",
    [
        (
            'type: "SGD" base_lr: 0.1 momentum: 0.9 weight_decay: 0.01 lr_policy: "multistep" '
            "gamma: 0.5 stepvalue: 1 stepvalue: 3",
            "",
        ),
        ('type: "Adam" base_lr: 0.01 lr_policy: "step" gamma: 0.5 stepsize: 3', ""),
        (
            'type: "AdaDelta" base_lr: 1 lr_policy: "fixed" momentum: 0.9 delta: 1e-6',
            "snapshot_format: HDF5",
        ),
        (
            'type: "Nesterov" base_lr: 0.1 lr_policy: "exp" gamma: 0.9 momentum: 0.9',
            "snapshot_format: HDF5",
        ),
    ],
)
def test_restore_then_continue_equals_an_uninterrupted_run(setup, body, fmt):
    """4 + 2 iterations through a snapshot give the 6-iteration result bit for bit (8 rows,
    batch 4: the data position after 4 iterations is the start, as after a restore)."""
    name = setup.solver(f"{body} {fmt} snapshot_prefix: 'snap'")
    whole = caffe.get_solver(name)
    whole.step(6)
    first = caffe.get_solver(name)
    first.step(4)
    state = first.snapshot()
    assert state == ("snap_iter_4.solverstate.h5" if fmt else "snap_iter_4.solverstate")
    resumed = caffe.get_solver(name)
    resumed.restore(state)
    assert resumed.iter == 4
    resumed.step(2)
    for name_, blobs in params(whole).items():
        for i, want in enumerate(blobs):
            np.testing.assert_array_equal(resumed.net.params[name_][i].data, want)
    for got, want in zip(history(resumed), history(whole)):
        np.testing.assert_array_equal(got, want)
    assert resumed.lr == whole.lr


def test_snapshot_files_hold_the_state(setup):
    solver = caffe.get_solver(setup.solver(f"{SGD} snapshot_prefix: 'out/run' snapshot_diff: true"))
    (setup.root / "out").mkdir()
    solver.step(3)
    state = read_solverstate(solver.snapshot())
    assert (state.iter, state.current_step, state.learned_net) == (
        3,
        0,
        "out/run_iter_3.caffemodel",
    )
    for got, want in zip(state.history, history(solver)):
        np.testing.assert_array_equal(got, want)
    model = caffe_pb2.NetParameter()
    model.ParseFromString((setup.root / "out/run_iter_3.caffemodel").read_bytes())
    ip1 = next(lp for lp in model.layer if lp.name == "ip1")
    assert len(ip1.blobs[0].diff) == 20  # snapshot_diff writes the diffs too


def test_hdf5_solver_state_has_caffes_layout(setup):
    """As hdf5_save_int / hdf5_save_string write them: Caffe's hdf5_load_string reads
    learned_net into a buffer of the string type's size and stops at the first NUL, so the
    stored string must carry its terminator; iter and current_step are 1-element int32."""
    import h5py

    solver = caffe.get_solver(setup.solver(f"{SGD} snapshot_prefix: 'run' snapshot_format: HDF5"))
    solver.step(2)
    with h5py.File(solver.snapshot(), "r") as h5:
        learned = h5["learned_net"]
        string_type = learned.id.get_type()
        assert learned.shape == ()
        assert string_type.get_size() == len("run_iter_2.caffemodel.h5") + 1
        assert string_type.get_strpad() == h5py.h5t.STR_NULLTERM
        for key, value in (("iter", 2), ("current_step", 0)):
            assert h5[key].shape == (1,) and h5[key].dtype == np.int32
            assert h5[key][0] == value


@pytest.mark.parametrize("fmt,kind", [("BINARYPROTO", "binary proto"), ("HDF5", "HDF5")])
def test_snapshot_log_lines_name_the_format_as_caffe(setup, caplog, fmt, kind):
    """Solver::SnapshotToBinaryProto / ToHDF5 and SGDSolver's SnapshotSolverState* log
    "Snapshotting to <kind> file M" and "Snapshotting solver state to <kind> file S"."""
    solver = caffe.get_solver(setup.solver(f"{SGD} snapshot_prefix: 'run' snapshot_format: {fmt}"))
    solver.step(1)
    with caplog.at_level("INFO", logger="torchcaffe.solver"):
        state = solver.snapshot()
    h5 = ".h5" if fmt == "HDF5" else ""
    assert [r.getMessage() for r in caplog.records] == [
        f"Snapshotting to {kind} file run_iter_1.caffemodel{h5}",
        f"Snapshotting solver state to {kind} file {state}",
    ]


def test_solve_snapshots_on_schedule_and_after_training(setup):
    name = setup.solver(f"{SGD} max_iter: 5 snapshot: 2 snapshot_prefix: 's'")
    (setup.root / name).write_text(
        (setup.root / name)
        .read_text()
        .replace("snapshot_after_train: false", "snapshot_after_train: true")
    )
    solver = caffe.get_solver(name)
    solver.solve()
    assert solver.iter == 5
    assert sorted(p.name for p in setup.root.glob("s_iter_*")) == [
        f"s_iter_{i}.{ext}" for i in (2, 4, 5) for ext in ("caffemodel", "solverstate")
    ]


def test_solve_resumes_from_a_state_file(setup):
    name = setup.solver(f"{SGD} max_iter: 6 snapshot_prefix: 's'")
    whole = caffe.get_solver(name)
    whole.solve()
    part = caffe.get_solver(name)
    part.step(4)
    state = part.snapshot()
    resumed = caffe.get_solver(name)
    resumed.solve(state)
    assert resumed.iter == 6
    np.testing.assert_array_equal(
        resumed.net.params["ip2"][0].data, whole.net.params["ip2"][0].data
    )


def test_test_nets_run_on_schedule_with_shared_weights(setup):
    body = f"{SGD} max_iter: 4 test_iter: 2 test_interval: 2 test_compute_loss: true"
    solver = caffe.get_solver(setup.solver(body))
    assert len(solver.test_nets) == 1 and solver.test_nets[0].phase == caffe.TEST
    seen = []
    original = solver.test

    def spy(index=0):
        seen.append(solver.iter)
        return original(index)

    solver.test = spy
    solver.solve()
    assert seen == [0, 2, 4]  # test_initialization, the interval, the end of Solve
    scores = solver.test_scores[0]
    assert list(scores) == ["accuracy", "loss"]
    test_net = solver.test_nets[0]
    np.testing.assert_array_equal(test_net.params["ip1"][0].data, solver.net.params["ip1"][0].data)
    # the mean of the two test batches (rows 0-3, 4-7) with the final weights
    losses = []
    for _ in range(2):
        test_net.forward()
        losses.append(float(test_net.blobs["loss"].data))
    assert scores["loss"].item() == pytest.approx(np.mean(losses), rel=1e-5)


def test_no_test_at_iteration_zero_without_test_initialization(setup):
    body = f"{SGD} test_iter: 1 test_interval: 2 test_initialization: false"
    solver = caffe.get_solver(setup.solver(body))
    seen = []
    solver.test = lambda index=0: seen.append(solver.iter)
    solver.step(3)
    assert seen == [2]


def test_smoothed_loss_averages_the_last_average_loss_iterations(setup):
    solver = caffe.get_solver(setup.solver(f"{SGD} average_loss: 3"))
    losses = []
    solver.add_callback(lambda: None, lambda: losses.append(float(solver.net.blobs["loss"].data)))
    solver.step(5)
    assert solver.smoothed_loss == pytest.approx(np.mean(losses[-3:]), rel=1e-5)


def test_callbacks_run_once_per_iteration(setup):
    solver = caffe.get_solver(setup.solver(SGD))
    calls = []
    solver.add_callback(
        lambda: calls.append(("start", solver.iter)), lambda: calls.append(("ready", solver.iter))
    )
    solver.step(2)
    assert calls == [("start", 0), ("ready", 0), ("start", 1), ("ready", 1)]


def test_stop_request_ends_training_early(setup):
    solver = caffe.get_solver(setup.solver(f"{SGD} max_iter: 10"))
    solver.action_request = lambda: STOP if solver.iter >= 2 else "none"
    solver.solve()
    assert solver.iter == 2 and solver.requested_early_exit


def test_pycaffe_classes_fix_the_rule_and_get_solver_reads_type(setup):
    name = setup.solver('type: "Adam" base_lr: 0.01 lr_policy: "fixed"')
    assert caffe.SGDSolver(name).type == "SGD"
    assert isinstance(caffe.get_solver(name), caffe.AdamSolver)
    for cls, rule in [
        (caffe.NesterovSolver, "Nesterov"),
        (caffe.AdaGradSolver, "AdaGrad"),
        (caffe.RMSPropSolver, "RMSProp"),
        (caffe.AdaDeltaSolver, "AdaDelta"),
    ]:
        solver = cls(name)
        assert solver.type == rule and type(solver.optimizer).caffe_type == rule


def test_old_solver_type_enum_is_upgraded(setup):
    name = setup.solver('solver_type: NESTEROV base_lr: 0.1 lr_policy: "fixed" momentum: 0.9')
    solver = caffe.get_solver(name)
    assert isinstance(solver, caffe.NesterovSolver) and solver.param.type == "Nesterov"


def test_inline_net_param_and_separate_test_net(setup):
    from torchcaffe.formats.prototxt import read_net

    param = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy="fixed", type="SGD")
    param.net_param.CopyFrom(read_net("train.prototxt"))
    param.test_iter.append(1)
    param.test_interval = 10
    solver = caffe.get_solver(param)
    assert "accuracy" in solver.test_nets[0].blobs and "accuracy" not in solver.net.blobs
    (setup.root / "s2.prototxt").write_text(
        'train_net: "train.prototxt" test_net: "train.prototxt" test_iter: 3 '
        'test_interval: 5 base_lr: 0.1 lr_policy: "fixed" '
        'test_state { stage: "x" }'
    )
    solver = caffe.get_solver("s2.prototxt")
    assert len(solver.test_nets) == 1 and list(solver.test_nets[0].module.state.stage) == ["x"]


def test_weights_field_fills_train_and_test_nets(setup):
    first = caffe.get_solver(setup.solver(SGD))
    first.net.params["ip1"][0].data[...] = 0.25
    first.net.save("w.caffemodel")
    body = f"{SGD} weights: 'w.caffemodel' test_iter: 1 test_interval: 5"
    solver = caffe.get_solver(setup.solver(body, "s3.prototxt"))
    assert (solver.net.params["ip1"][0].data == 0.25).all()
    assert (solver.test_nets[0].params["ip1"][0].data == 0.25).all()


def test_each_weights_file_is_logged_for_each_net_as_caffe(setup, caplog):
    """LoadNetWeights logs "Finetuning from F" for each file, into the train net and then
    into each test net."""
    caffe.get_solver(setup.solver(SGD)).net.save("w.caffemodel")
    caffe.get_solver(setup.solver(SGD)).net.save("v.caffemodel")
    body = f"{SGD} weights: 'w.caffemodel, v.caffemodel' test_iter: 1 test_interval: 5"
    with caplog.at_level("INFO", logger="torchcaffe.solver"):
        caffe.get_solver(setup.solver(body, "s3.prototxt"))
    lines = [r.getMessage() for r in caplog.records if "Finetuning" in r.getMessage()]
    assert lines == ["Finetuning from w.caffemodel", "Finetuning from v.caffemodel"] * 2


def test_random_seed_makes_the_initial_weights_repeatable(setup):
    a = caffe.get_solver(setup.solver(SGD, seed=3))
    b = caffe.get_solver(setup.solver(SGD, seed=3))
    np.testing.assert_array_equal(a.net.params["ip1"][0].data, b.net.params["ip1"][0].data)


def test_lr_mult_zero_and_buffers_do_not_move(setup):
    text = (
        (setup.root / "train.prototxt")
        .read_text()
        .replace(
            "param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }",
            "param { lr_mult: 0 } param { lr_mult: 0 }",
        )
    )
    (setup.root / "frozen.prototxt").write_text(text)
    solver = caffe.get_solver(setup.solver(SGD, net="frozen.prototxt"))
    before = params(solver)
    solver.step(3)
    for i in (0, 1):
        np.testing.assert_array_equal(solver.net.params["ip1"][i].data, before["ip1"][i])
    assert not np.array_equal(solver.net.params["ip2"][0].data, before["ip2"][0])


@pytest.mark.parametrize("reg", ["L2", "L1"])
def test_batch_norm_statistics_history_grows_with_weight_decay(setup, reg):
    """BatchNorm's statistics are learnable blobs in Caffe (lr_mult forced to 0, decay_mult
    left at 1): ApplyUpdate regularizes their zero diff into ``decay * w`` and Adam's m and v
    take it in, while the update (0 * ...) leaves them. The .solverstate holds that history."""
    text = (setup.root / "train.prototxt").read_text()
    text = text.replace(
        'layer { name: "relu"',
        'layer { name: "bn" type: "BatchNorm" bottom: "ip1" top: "ip1" }\nlayer { name: "relu"',
    )
    (setup.root / "bn.prototxt").write_text(text)
    body = 'type: "Adam" base_lr: 0.01 momentum: 0.9 lr_policy: "fixed" weight_decay: 0.1 '
    body += f'regularization_type: "{reg}"'
    solver = caffe.get_solver(setup.solver(body, net="bn.prototxt"))
    f32 = np.float32
    beta1, beta2, decay = f32(0.9), f32(0.999), f32(0.1)
    m = [np.zeros_like(b.data) for b in solver.net.params["bn"]]
    v = [np.zeros_like(b.data) for b in solver.net.params["bn"]]
    for _ in range(3):
        before = [b.data.copy() for b in solver.net.params["bn"]]
        solver.step(1)
        for j, blob in enumerate(solver.net.params["bn"]):
            w = blob.data  # forward moved the statistics; the update leaves them
            assert not np.array_equal(w, before[j])
            g = decay * (w if reg == "L2" else np.sign(w).astype(f32))
            m[j] = beta1 * m[j] + (1 - beta1) * g
            v[j] = beta2 * v[j] + (1 - beta2) * g * g
            np.testing.assert_array_equal(blob.diff, 0)
    state = read_solverstate(solver.snapshot()).history
    n = len(solver._learnables)  # ip1 w, b; bn mean, variance, factor; ip2 w, b
    for j in range(3):
        np.testing.assert_allclose(state[2 + j], m[j], rtol=1e-5)
        np.testing.assert_allclose(state[n + 2 + j], v[j], rtol=1e-5)
    assert np.abs(state[n + 2]).max() > 0


def test_apply_update_leaves_the_applied_step_in_the_diff(setup):
    """As Caffe, the param diff holds the update that was subtracted (SGD: the history)."""
    solver = caffe.get_solver(setup.solver(SGD))
    solver.net.clear_param_diffs()
    solver.net.forward_backward()
    before = solver.net.params["ip2"][0].data.copy()
    solver.apply_update()
    diff = solver.net.params["ip2"][0].diff
    np.testing.assert_allclose(before - diff, solver.net.params["ip2"][0].data, atol=1e-7)
    assert solver.iter == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU mode needs CUDA")
def test_gpu_mode_matches_cpu(setup):
    name = setup.solver('type: "Adam" base_lr: 0.01 lr_policy: "fixed"')
    cpu = caffe.get_solver(name)
    cpu.step(4)
    caffe.set_mode_gpu()
    gpu = caffe.get_solver(name)
    gpu.step(4)
    np.testing.assert_allclose(
        gpu.net.params["ip1"][0].data, cpu.net.params["ip1"][0].data, rtol=1e-4, atol=1e-6
    )
    state = read_solverstate(gpu.snapshot())
    for got, want in zip(state.history, history(cpu)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_torch_face_optimizer_trains_like_the_solver(setup):
    """make_optimizer / make_lr_policy over a torchcaffe.load net, driven by autograd on the
    total loss, follow the Caffe-face solver's trajectory."""
    from torchcaffe.solver import load_solver_param, make_lr_policy, make_optimizer

    name = setup.solver(
        'type: "SGD" base_lr: 0.1 momentum: 0.9 weight_decay: 0.01 '
        'lr_policy: "step" gamma: 0.5 stepsize: 2'
    )
    solver = caffe.get_solver(name)
    solver.net.save("init.caffemodel")
    solver.step(5)
    param, _ = load_solver_param(name)
    net = caffe.load("train.prototxt", "init.caffemodel", phase="train")
    opt = make_optimizer(param, net)
    sched = make_lr_policy(param, opt)
    for _ in range(5):
        opt.zero_grad()
        net.total_loss(net.forward_all_blobs()).backward()
        opt.step()
        sched.step()
    for layer in ("ip1", "ip2"):
        for i, tensor in enumerate(net.layer(layer).param_blobs()):
            np.testing.assert_allclose(
                tensor.detach().numpy(), solver.net.params[layer][i].data, rtol=1e-5, atol=1e-6
            )


def test_torch_face_optimizer_takes_a_solver_path_and_refuses_other_things(setup):
    """``make_optimizer("solver.prototxt", net)`` reads the file; the (param, path) pair that
    ``load_solver_param`` returns, an unknown type or lr_policy: a SolverError saying so,
    not an AttributeError or KeyError from inside."""
    from torchcaffe.errors import SolverError
    from torchcaffe.solver import load_solver_param, make_lr_policy, make_optimizer

    name = setup.solver('type: "Nesterov" base_lr: 0.1 momentum: 0.9 lr_policy: "fixed"')
    net = caffe.load("train.prototxt", phase="train")
    opt = make_optimizer(name, net)
    assert type(opt) is type(make_optimizer(load_solver_param(name)[0], net))
    assert make_lr_policy(name, opt).get_last_lr() == pytest.approx([0.1] * len(opt.param_groups))
    with pytest.raises(SolverError, match="first item"):
        make_optimizer(load_solver_param(name), net)
    param = load_solver_param(name)[0]
    param.type = "nesterov"
    with pytest.raises(SolverError, match="unknown solver type 'nesterov'"):
        make_optimizer(param, net)
    param.type, param.lr_policy = "Nesterov", "cosine"
    with pytest.raises(SolverError, match="unknown lr_policy 'cosine'"):
        make_lr_policy(param, opt)


@pytest.mark.parametrize("rule", ['type: "SGD" momentum: 0.9', 'type: "Adam"'])
def test_torch_face_steps_params_that_backward_leaves_without_a_grad(setup, rule):
    """With ``propagate_down: false`` above ip1 its diff stays zero, yet Caffe's ApplyUpdate
    still decays it (and runs the rule, momentum and Adam's count included): after
    ``zero_grad`` its grad is None, and the optimizer must step it as with a zero gradient."""
    from torchcaffe.solver import load_solver_param, make_lr_policy, make_optimizer

    text = (setup.root / "train.prototxt").read_text()
    text = text.replace('top: "ip1" }', 'top: "ip1" propagate_down: false }')
    (setup.root / "frozen.prototxt").write_text(text)
    name = setup.solver(
        f"{rule} base_lr: 0.1 weight_decay: 0.1 lr_policy: 'fixed'", net="frozen.prototxt"
    )
    solver = caffe.get_solver(name)
    solver.net.save("init.caffemodel")
    solver.step(3)
    param, _ = load_solver_param(name)
    net = caffe.load("frozen.prototxt", "init.caffemodel", phase="train")
    opt = make_optimizer(param, net)
    sched = make_lr_policy(param, opt)
    for _ in range(3):
        opt.zero_grad()
        net.total_loss(net.forward_all_blobs()).backward()
        assert net.layer("ip1").param_blobs()[0].grad is None
        opt.step()
        sched.step()
    for layer in ("ip1", "ip2"):
        for i, tensor in enumerate(net.layer(layer).param_blobs()):
            np.testing.assert_allclose(
                tensor.detach().numpy(), solver.net.params[layer][i].data, rtol=1e-5, atol=1e-6
            )


def test_fused_clear_runs_and_equals_the_separate_clear_bitwise(setup, monkeypatch):
    """With iter_size 1 and no callbacks, Step clears the param diffs inside the one pass
    (diff = grad + 0, never zeroed first); params, history, diffs and losses are those of the
    separate ClearParamDiffs + ForwardBackward, which a callback's presence keeps."""
    name = setup.solver(SGD)
    fused, separate = caffe.get_solver(name), caffe.get_solver(name)
    separate.add_callback(lambda: None, lambda: None)
    clears = []
    real = Net.clear_param_diffs
    monkeypatch.setattr(Net, "clear_param_diffs", lambda n: clears.append(n) or real(n))
    fused.step(5)
    assert clears == []
    separate.step(5)
    assert len(clears) == 5 and all(n is separate.net for n in clears)
    assert fused.smoothed_loss == separate.smoothed_loss
    for name_, blobs in params(separate).items():
        for got, want in zip(params(fused)[name_], blobs):
            np.testing.assert_array_equal(got, want)
    for got, want in zip(history(fused), history(separate)):
        np.testing.assert_array_equal(got, want)
    for a, b in zip(fused.net.params.values(), separate.net.params.values()):
        for x, y in zip(a, b):
            assert np.array_equal(x.diff.view(np.int32), y.diff.view(np.int32))  # -0 too


def test_grad_plus_zero_is_zero_plus_grad_bit_for_bit():
    """The fused clear's arithmetic: ``grad + 0.0`` leaves what ``zeros.add_(grad)`` does,
    as one tensor op and as the foreach op over adopted gradients (a large one included)."""
    g = torch.tensor([-0.0, 0.0, 1.5, -2.0, float("nan"), float("inf"), -1e-45])
    separate = torch.zeros_like(g).add_(g)
    fused = torch.add(g, 0.0)
    in_place, large = g.clone(), torch.full((100_003,), -0.0)
    torch._foreach_add_([in_place, large], 0.0)
    for got in (fused, in_place):
        assert torch.equal(got.view(torch.int32), separate.view(torch.int32))
    assert not large.view(torch.int32).any()  # every -0 became +0


def _diff_bits(solver):
    return [b.diff.view(np.int32).copy() for v in solver.net.params.values() for b in v]


def test_fused_step_adopts_autograd_gradients_as_the_param_diffs(setup, monkeypatch):
    """The fused clear hands each param autograd's own gradient as ``.grad`` and diff (the
    ``+ 0`` runs in place), with no copy into the old buffer; a diff someone holds a numpy
    view of keeps its buffer and sees the values. Both end bit for bit as the separate
    ClearParamDiffs + ForwardBackward leaves them."""
    name = setup.solver(SGD)
    fast, held, separate = (caffe.get_solver(name) for _ in range(3))
    separate.add_callback(lambda: None, lambda: None)  # a callback keeps the separate clear
    held_blobs = [b for v in held.net.params.values() for b in v]
    views = [b.diff for b in held_blobs]
    buffers = [b.diff_memory.cpu_data() for b in held_blobs]
    returned = []  # per call, the gradients' addresses (holding them would be a view)
    real = torch.autograd.grad

    def grad(*args, **kwargs):
        got = real(*args, **kwargs)
        returned.append({g.data_ptr() for g in got if g is not None})
        return got

    monkeypatch.setattr(torch.autograd, "grad", grad)
    fast.step(3)
    last = returned[-1]  # the last step's gradients: adopted at every step, not only the first
    learned = [e.tensor for e in fast._learnables]
    assert learned and all(p.grad.data_ptr() in last for p in learned)  # adopted every step
    for solver in (held, separate):
        solver.step(3)
    for view, buffer, blob in zip(views, buffers, held_blobs):
        assert blob.diff_memory.cpu_data() is buffer  # a held view: its buffer stays
        np.testing.assert_array_equal(view, blob.diff)
    for solver in (fast, held):
        for got, want in zip(_diff_bits(solver), _diff_bits(separate)):
            np.testing.assert_array_equal(got, want)  # -0 too
        for got, want in zip(history(solver), history(separate)):
            np.testing.assert_array_equal(got, want)
        for name_, blobs in params(separate).items():
            for got, want in zip(params(solver)[name_], blobs):
                np.testing.assert_array_equal(got, want)


def test_step_builds_no_progress_bar_it_would_not_show(setup, monkeypatch):
    """``step(1)`` and ``progress=False`` construct no tqdm (its cost is paid per call);
    ``progress=True`` over several iterations still shows one."""
    from torchcaffe.solver import solver as solver_module

    made = []
    real = solver_module.tqdm
    monkeypatch.setattr(solver_module, "tqdm", lambda *a, **k: made.append(k) or real(*a, **k))
    name = setup.solver(SGD)
    caffe.get_solver(name).step(1)
    caffe.get_solver(name, progress=False).step(3)
    assert made == []
    caffe.get_solver(name, progress=True).step(3)
    assert len(made) == 1 and made[0]["total"] == 3


def test_test_scores_sum_in_float32_as_caffe(tmp_path):
    """Solver::Test keeps its sums in a vector<Dtype>: a hundred 0.1f add up to 10.000002f."""
    net = tmp_path / "net.prototxt"
    net.write_text(
        'layer { name: "d" type: "DummyData" top: "x" dummy_data_param { shape { dim: 1 } '
        'data_filler { type: "constant" value: 0.1 } } }'
    )
    solver_file = tmp_path / "solver.prototxt"
    solver_file.write_text(
        f'net: "{net}" test_iter: 100 test_interval: 1000 base_lr: 0.1 lr_policy: "fixed" '
        "max_iter: 1 test_initialization: false"
    )
    solver = caffe.get_solver(str(solver_file))
    total = np.float32(0.0)
    for _ in range(100):
        total += np.float32(0.1)
    want = total / np.float32(100)
    assert want != np.float32(np.float64(np.float32(0.1)) * 100 / 100)  # the case tells them apart
    score = solver.test(0)["x"]
    assert score.dtype == np.float32 and score.item() == want


@pytest.mark.parametrize("iter_size", [1, 3])
def test_smoothed_loss_is_kept_in_float_as_caffe(tmp_path, iter_size):
    """UpdateSmoothedLoss's running mean is Dtype arithmetic; so is Step's iter_size average."""
    net = tmp_path / "net.prototxt"
    net.write_text(
        'layer { name: "d" type: "DummyData" top: "a" top: "b" dummy_data_param { '
        "shape { dim: 2 dim: 3 } shape { dim: 2 dim: 3 } "
        'data_filler { type: "uniform" min: 0 max: 1 } } } '
        'layer { name: "ip" type: "InnerProduct" bottom: "a" top: "y" '
        'inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } } '
        'layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "b" top: "loss" }'
    )
    solver_file = tmp_path / "solver.prototxt"
    solver_file.write_text(
        f'net: "{net}" base_lr: 0.1 lr_policy: "fixed" max_iter: 20 average_loss: 3 '
        f"iter_size: {iter_size} random_seed: 7"
    )
    solver = caffe.get_solver(str(solver_file))
    passes: list[float] = []
    for name in ("forward_backward", "_clear_and_forward_backward"):
        run = getattr(solver.net, name)
        setattr(solver.net, name, lambda run=run: passes.append(run()) or passes[-1])
    smoothed = []
    original = solver._update_smoothed_loss

    def spy(loss, start_iter):
        original(loss, start_iter)
        smoothed.append(solver.smoothed_loss)

    solver._update_smoothed_loss = spy
    solver.step(12)
    # Caffe's arithmetic, in float
    want, window, mean = [], [], np.float32(0.0)
    for it in range(12):
        loss = np.float32(0.0)
        for k in range(iter_size):
            loss += np.float32(passes[it * iter_size + k])
        loss /= np.float32(iter_size)
        if len(window) < 3:
            window.append(loss)
            mean = (mean * np.float32(len(window) - 1) + loss) / np.float32(len(window))
        else:
            mean += (loss - window[it % 3]) / np.float32(3)
            window[it % 3] = loss
        want.append(mean)
    assert [np.float32(s) for s in smoothed] == want


def test_an_explicit_empty_snapshot_prefix_snapshots_as_caffe(setup):
    """CheckSnapshotWritePermissions only checks that snapshot_prefix is given: with
    ``snapshot_prefix: ""`` Caffe writes ``_iter_N.caffemodel`` in the working directory."""
    solver = caffe.SGDSolver(
        setup.solver('base_lr: 0.1 lr_policy: "fixed" snapshot: 2 snapshot_prefix: ""')
    )
    solver.step(2)
    assert (setup.root / "_iter_2.caffemodel").is_file()
    assert (setup.root / "_iter_2.solverstate").is_file()


# Caffe: NetTest's TrickyNet names two layers 'innerproduct'. Net::Init keeps both, and
# learnable_params_ holds each one's blobs, so a solver step updates both layers.
SAME_NAMES = """
name: "same_names"
layer { name: "data" type: "Input" top: "data" top: "y"
        input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "a"
        inner_product_param { num_output: 4 weight_filler { type: "constant" value: 0.5 } } }
layer { name: "ip" type: "InnerProduct" bottom: "a" top: "b"
        inner_product_param { num_output: 4 weight_filler { type: "constant" value: -0.25 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "b" bottom: "y" }
"""


def test_layers_sharing_a_name_each_learn(tmp_path):
    (tmp_path / "net.prototxt").write_text(SAME_NAMES)
    (tmp_path / "solver.prototxt").write_text(
        f'net: "{tmp_path / "net.prototxt"}" base_lr: 0.1 lr_policy: "fixed"'
    )
    solver = caffe.SGDSolver(str(tmp_path / "solver.prototxt"))
    net = solver.net
    net.blobs["data"].data[...] = np.arange(6).reshape(2, 3)
    net.blobs["y"].data[...] = 1
    net.forward_backward()
    first, second = net.layers[1].blobs, net.layers[2].blobs
    want = [b.data - np.float32(0.1) * b.diff for b in (*first, *second)]
    assert all(np.abs(b.diff).sum() > 0 for b in (*first, *second))
    solver.step(1)
    for blob, expected in zip((*first, *second), want):
        np.testing.assert_allclose(blob.data, expected, rtol=1e-6)
    groups = caffe.param_groups(net.module, lr=0.1)
    learned = [p for g in groups for p in g["params"]]
    assert len(learned) == len({id(p) for p in learned}) == 4
