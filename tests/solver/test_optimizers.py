"""Caffe's update rules against numpy statements of sgd_solver.cpp and solvers/*.cpp.

Each reference applies Caffe's ApplyUpdate to plain arrays: global-norm clipping of the raw
(accumulated) diffs, then per param 1/iter_size, weight decay (L2: + decay*w, L1:
+ decay*sign(w)), the rule's history update with local_rate = rate*lr_mult, and w -= update.
Run in float64, so the formula (not float32 rounding) is what is compared.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchcaffe.errors import SolverError
from torchcaffe.solver import OPTIMIZERS, make_optimizer, multiplier_groups
from torchcaffe.solver.optimizers import CaffeSGD

SHAPES = [(3, 4), (4,)]
MULTS = [(1.0, 1.0), (2.0, 0.0)]  # (lr_mult, decay_mult) per param, as weights / biases
RULE_ARGS = {
    "SGD": {"momentum": 0.9},
    "Nesterov": {"momentum": 0.8},
    "AdaGrad": {"delta": 1e-7},
    "RMSProp": {"rms_decay": 0.95, "delta": 1e-6},
    "AdaDelta": {"momentum": 0.95, "delta": 1e-6},
    "Adam": {"momentum": 0.9, "momentum2": 0.999, "delta": 1e-8},
}
N_HISTORY = {"AdaDelta": 2, "Adam": 2}


def ref_rule(rule, g, h, it, lr, a):
    """One param's Caffe ComputeUpdateValue: returns the update; mutates history list h."""
    if rule == "SGD":
        h[0] = a["momentum"] * h[0] + lr * g
        return h[0].copy()
    if rule == "Nesterov":
        prev = h[0].copy()
        h[0] = a["momentum"] * h[0] + lr * g
        return (1 + a["momentum"]) * h[0] - a["momentum"] * prev
    if rule == "AdaGrad":
        h[0] = h[0] + g * g
        return lr * g / (np.sqrt(h[0]) + a["delta"])
    if rule == "RMSProp":
        h[0] = a["rms_decay"] * h[0] + (1 - a["rms_decay"]) * g * g
        return lr * g / (np.sqrt(h[0]) + a["delta"])
    if rule == "AdaDelta":
        m, d = a["momentum"], a["delta"]
        h[0] = m * h[0] + (1 - m) * g * g
        u = g * np.sqrt((h[1] + d) / (h[0] + d))
        h[1] = m * h[1] + (1 - m) * u * u
        return lr * u
    if rule == "Adam":
        b1, b2, t = a["momentum"], a["momentum2"], it + 1
        h[0] = b1 * h[0] + (1 - b1) * g
        h[1] = b2 * h[1] + (1 - b2) * g * g
        return lr * math.sqrt(1 - b2**t) / (1 - b1**t) * h[0] / (np.sqrt(h[1]) + a["delta"])
    raise AssertionError(rule)


def ref_apply_update(rule, ws, gs, hs, it, rate, a, *, decay, reg="L2", clip=-1.0, iter_size=1):
    gs = [g.copy() for g in gs]
    if clip >= 0:
        norm = math.sqrt(sum(float((g * g).sum()) for g in gs))
        if norm > clip:
            gs = [g * (clip / norm) for g in gs]
    updates = []
    for w, g, h, (lr_mult, decay_mult) in zip(ws, gs, hs, MULTS):
        g = g / iter_size
        local_decay = decay * decay_mult
        if local_decay:
            g = g + local_decay * (w if reg == "L2" else np.sign(w))
        updates.append(ref_rule(rule, g, h, it, rate * lr_mult, a))
    return [w - u for w, u in zip(ws, updates)], updates


def run_both(rule, steps=4, *, decay=0.01, reg="L2", clip=-1.0, iter_size=1, rate=0.05):
    rng = np.random.default_rng(11)
    ws = [rng.standard_normal(s) for s in SHAPES]
    a = RULE_ARGS[rule]
    params = [torch.nn.Parameter(torch.tensor(w)) for w in ws]
    groups = [
        {"params": [p], "lr_mult": lm, "decay_mult": dm} for p, (lm, dm) in zip(params, MULTS)
    ]
    opt = OPTIMIZERS[rule](
        groups,
        rate,
        weight_decay=decay,
        regularization_type=reg,
        clip_gradients=clip,
        iter_size=iter_size,
        **a,
    )
    hs = [[np.zeros(s) for _ in range(N_HISTORY.get(rule, 1))] for s in SHAPES]
    for it in range(steps):
        gs = [rng.standard_normal(s) * 3 for s in SHAPES]
        for p, g in zip(params, gs):
            p.grad = torch.tensor(g)
        ws, updates = ref_apply_update(
            rule, ws, gs, hs, it, rate, a, decay=decay, reg=reg, clip=clip, iter_size=iter_size
        )
        opt.step()
        for p, w, u in zip(params, ws, updates):
            np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(p.grad.numpy(), u, rtol=1e-12, atol=1e-12)
    want_history = [h[k] for k in range(N_HISTORY.get(rule, 1)) for h in hs]
    got_history = opt.history_blobs(params)
    assert len(got_history) == len(want_history)
    for got, want in zip(got_history, want_history):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rule", sorted(OPTIMIZERS))
def test_rule_matches_caffe_formula(rule):
    run_both(rule)


@pytest.mark.parametrize("rule", ["SGD", "AdaGrad"])
def test_l1_regularization_adds_decay_times_sign(rule):
    run_both(rule, reg="L1", decay=0.05)


@pytest.mark.parametrize("rule", ["SGD", "Adam"])
def test_clip_gradients_scales_by_the_global_norm(rule):
    run_both(rule, clip=1.5)  # grads have norm ~ 3*sqrt(16): always clipped


def test_clip_is_a_no_op_below_the_threshold():
    run_both("SGD", clip=1e6)


def test_clipping_logs_caffes_line_and_no_clip_logs_nothing(caplog):
    """SGDSolver::ClipGradients logs "Gradient clipping: scaling down gradients (L2 norm N >
    C) by scale factor F" when it scales, and nothing when the norm is within the bound."""
    param = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = OPTIMIZERS["SGD"]([{"params": [param]}], 0.1, clip_gradients=2.5)
    with caplog.at_level("INFO", logger="torchcaffe.solver"):
        for grad in ([3.0, 4.0], [0.3, 0.4]):
            param.grad = torch.tensor(grad, dtype=torch.float64)
            opt.step()
    assert [r.getMessage() for r in caplog.records] == [
        "Gradient clipping: scaling down gradients (L2 norm 5 > 2.5) by scale factor 0.5"
    ]


@pytest.mark.parametrize("rule", ["SGD", "RMSProp"])
def test_iter_size_divides_the_accumulated_gradient(rule):
    run_both(rule, iter_size=3)


def test_float32_clip_factor_is_computed_in_float_as_caffe():
    """SGDSolver::ClipGradients adds the blobs' sums of squares into a Dtype, takes its Dtype
    square root and divides clip by it in Dtype; the double norm gave a factor one ulp off
    in about a third of these cases, so the clipped update differed from Caffe's."""
    for seed in range(40):
        rng = np.random.default_rng(seed)
        grads = [rng.standard_normal(s).astype(np.float32) for s in ((7, 3), (5,))]
        sumsq = np.float32(0)
        for g in grads:
            sumsq = np.float32(sumsq + np.float32(np.sum(g.astype(np.float64) ** 2)))
        factor = np.float32(0.7) / np.sqrt(sumsq)
        params = [torch.nn.Parameter(torch.zeros(g.shape)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g)
        CaffeSGD(params, 1.0, clip_gradients=0.7).step()
        for p, g in zip(params, grads):
            np.testing.assert_array_equal(p.detach().numpy(), -(g * factor))


def test_clip_sees_the_accumulated_not_the_averaged_gradient():
    """Caffe clips before dividing by iter_size: clip=1 with iter_size=2 is not clip=0.5."""
    run_both("SGD", clip=1.0, iter_size=2, decay=0.0)


def test_momentum_keeps_the_learning_rate_inside_the_history():
    """Caffe's history holds lr*grad, so a rate change affects only new contributions."""
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = CaffeSGD([p], 1.0, momentum=0.5)
    for lr in (1.0, 0.1):
        for group in opt.param_groups:
            group["lr"] = lr
        p.grad = torch.ones(1, dtype=torch.float64)
        opt.step()
    # step 1: h = 1; step 2: h = 0.5*1 + 0.1*1 = 0.6 (torch's SGD would give 0.1*1.5 = 0.15)
    assert p.item() == pytest.approx(-1.6)


def test_params_without_grad_are_skipped():
    a = torch.nn.Parameter(torch.ones(2))
    b = torch.nn.Parameter(torch.ones(2))
    opt = CaffeSGD([a, b], 0.1, weight_decay=0.5)
    a.grad = torch.ones(2)
    opt.step()
    assert torch.equal(b.detach(), torch.ones(2))
    assert not torch.equal(a.detach(), torch.ones(2))


def test_float32_scalars_are_rounded_like_caffe_dtype():
    """lr*lr_mult is formed in float32, as Caffe's Dtype local_rate."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = CaffeSGD([{"params": [p], "lr_mult": 3.0}], 0.1)
    p.grad = torch.ones(1)
    opt.step()
    local_rate = np.float32(np.float32(0.1) * np.float32(3.0))
    assert p.item() == -float(local_rate)


def test_load_history_round_trip_and_device_follow():
    p = torch.nn.Parameter(torch.randn(3))
    opt = OPTIMIZERS["Adam"]([p], 0.01)
    blobs = [torch.full((3,), 0.5), torch.full((3,), 0.25)]
    opt.load_history_blobs([p], blobs, iteration=7)
    assert opt.state[p]["step"] == 7
    got = opt.history_blobs([p])
    assert all(torch.equal(g, b) for g, b in zip(got, blobs))
    with pytest.raises(SolverError, match="expected 2 history blobs"):
        opt.load_history_blobs([p], blobs[:1], iteration=0)


@pytest.mark.parametrize(
    "momentum, momentum2, step",
    [(0.9, 2.0, 0), (1.0, 0.999, 0), (0.9, 10.0, 400)],
)
def test_adam_out_of_range_betas_give_nan_as_caffe(momentum, momentum2, step):
    """Caffe takes any momentum/momentum2 and its C arithmetic makes the update NaN; Python's
    math raised ValueError / ZeroDivisionError / OverflowError from the middle of a step."""
    p = torch.nn.Parameter(torch.ones(2))
    opt = OPTIMIZERS["Adam"]([p], 0.01, momentum=momentum, momentum2=momentum2)
    opt.state[p]["step"] = step
    p.grad = torch.ones(2)
    opt.step()
    assert torch.isnan(p).all()


def test_bad_constructor_arguments():
    p = [torch.nn.Parameter(torch.zeros(1))]
    with pytest.raises(SolverError, match="regularization_type"):
        CaffeSGD(p, 0.1, regularization_type="L3")
    with pytest.raises(SolverError, match="iter_size"):
        CaffeSGD(p, 0.1, iter_size=0)
    with pytest.raises(SolverError, match="learning rate"):
        CaffeSGD(p, -1.0)


# -- param groups from a net --------------------------------------------------------------
GROUP_NET = """
name: "g"
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } } }
layer { name: "c1" type: "Convolution" bottom: "x" top: "c1"
        param { name: "shared_w" lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        convolution_param { num_output: 3 kernel_size: 1 } }
layer { name: "bn" type: "BatchNorm" bottom: "c1" top: "c1" }
layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2"
        param { name: "shared_w" } param { lr_mult: 0 }
        convolution_param { num_output: 3 kernel_size: 1 } }
"""


def test_param_groups_follow_caffe_learnable_params(tmp_path):
    import torchcaffe
    from torchcaffe.proto import caffe_pb2
    from torchcaffe.solver import learnable_params

    path = tmp_path / "g.prototxt"
    path.write_text(GROUP_NET)
    net = torchcaffe.load(path, phase="train")
    entries = learnable_params(net)
    # c1 weight (owner of shared_w), c1 bias, bn's 3 statistics, c2 bias; c2's weight is shared
    assert [(e.layer, e.index) for e in entries] == [
        ("c1", 0),
        ("c1", 1),
        ("bn", 0),
        ("bn", 1),
        ("bn", 2),
        ("c2", 1),
    ]
    groups = multiplier_groups(net, lr=0.1)  # Caffe's rules apply the multipliers themselves
    assert [(g["lr_mult"], g["decay_mult"], len(g["params"])) for g in groups] == [
        (1.0, 1.0, 1),
        (2.0, 0.0, 1),
        (0.0, 1.0, 1),
    ]
    assert all(g["lr"] == 0.1 for g in groups)
    param = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy="fixed", type="Adam")
    opt = make_optimizer(param, net)
    assert type(opt).__name__ == "CaffeAdam"
    assert sum(len(g["params"]) for g in opt.param_groups) == 3  # buffers stay out


@pytest.mark.parametrize("regularization", ["L2", "L1"])
@pytest.mark.parametrize("rule", sorted(RULE_ARGS))
def test_foreach_step_equals_the_per_param_loop_bitwise(rule, regularization):
    """The default ``_foreach`` step gives the per-param loop's params, diffs and history, bit
    for bit, with two multiplier groups, accumulated passes and clipping that fires."""
    rng = np.random.default_rng(3)
    init = [rng.standard_normal(s).astype(np.float32) for s in [(5, 4), (4,), (3, 3), (3,)]]
    grads = [[rng.standard_normal(p.shape).astype(np.float32) for p in init] for _ in range(4)]

    def run(foreach: bool) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in init]
        groups = [
            {"params": params[:2], "lr_mult": 1.0, "decay_mult": 1.0},
            {"params": params[2:], "lr_mult": 2.0, "decay_mult": 0.5},
        ]
        opt = OPTIMIZERS[rule](
            groups,
            0.05,
            weight_decay=0.01,
            regularization_type=regularization,
            clip_gradients=4.0,
            iter_size=2,
            foreach=foreach,
            **RULE_ARGS[rule],
        )
        for step in grads:
            for p, g in zip(params, step):
                p.grad = torch.from_numpy(g.copy())
            opt.step()
        return params, [p.grad for p in params], opt.history_blobs(params)

    for got, want in zip(*[sum(run(f), []) for f in (True, False)]):
        assert torch.equal(got, want)


@pytest.mark.parametrize("rule", ["SGD", "Nesterov"])
def test_sgd_rules_update_all_params_in_foreach_ops(rule, monkeypatch):
    """SGD and Nesterov never fall back to their per-param ``_update`` by default."""
    cls = OPTIMIZERS[rule]
    monkeypatch.setattr(cls, "_update", lambda *a: pytest.fail("per-param update ran"))
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, 2))]
    for p in params:
        p.grad = torch.full_like(p, 0.5)
    cls(params, 0.1, momentum=0.9, weight_decay=0.01).step()
    assert all(float(p.detach().max()) < 1 for p in params)
