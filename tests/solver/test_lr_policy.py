"""lr_policy schedulers against numpy statements of Caffe's GetLearningRate.

The scheduler's ``last_epoch`` is Caffe's ``iter_``: after ``k`` (optimizer.step,
scheduler.step) pairs the group rate is Caffe's rate at ``iter_ == k``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchcaffe.proto import caffe_pb2
from torchcaffe.solver import LR_POLICIES, make_lr_policy, make_optimizer
from torchcaffe.solver.lr_policy import policy_arguments
from torchcaffe.solver.optimizers import CaffeSGD

BASE = 0.1
PARAMS = {
    "fixed": {},
    "step": {"gamma": 0.5, "stepsize": 3},
    "exp": {"gamma": 0.9},
    "inv": {"gamma": 0.1, "power": 0.75},
    "multistep": {"gamma": 0.3, "stepvalue": [2, 2, 5, 9]},
    "poly": {"power": 2.0, "max_iter": 12},
    "sigmoid": {"gamma": 0.5, "stepsize": 6},
}


def ref_rates(policy, n, p):
    """Caffe's rates for iter_ = 0..n-1, multistep's current_step_ carried between calls."""
    rates, step = [], 0
    for it in range(n):
        if policy == "fixed":
            r = BASE
        elif policy == "step":
            r = BASE * p["gamma"] ** (it // p["stepsize"])
        elif policy == "exp":
            r = BASE * p["gamma"] ** it
        elif policy == "inv":
            r = BASE * (1 + p["gamma"] * it) ** -p["power"]
        elif policy == "multistep":
            if step < len(p["stepvalue"]) and it >= p["stepvalue"][step]:
                step += 1  # at most one step per call, as Caffe
            r = BASE * p["gamma"] ** step
        elif policy == "poly":
            r = BASE * (1 - it / p["max_iter"]) ** p["power"]
        else:
            r = BASE / (1 + math.exp(-p["gamma"] * (it - p["stepsize"])))
        rates.append(r)
    return rates


def scheduler(policy, p=None):
    p = PARAMS[policy] if p is None else p
    param = torch.nn.Parameter(torch.zeros(1))
    opt = CaffeSGD([{"params": [param], "lr_mult": 1.0}, {"params": [], "lr_mult": 2.0}], BASE)
    return opt, LR_POLICIES[policy](opt, **p)


def run_rates(opt, sched, n):
    rates = []
    for _ in range(n):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


@pytest.mark.parametrize("policy", sorted(LR_POLICIES))
def test_policy_matches_caffe_formula(policy):
    opt, sched = scheduler(policy)
    got = run_rates(opt, sched, 12)
    np.testing.assert_allclose(got, ref_rates(policy, 12, PARAMS[policy]), rtol=1e-6)
    assert all(g["lr"] == opt.param_groups[0]["lr"] for g in opt.param_groups)
    assert sched.lr == opt.param_groups[0]["lr"]


def test_rates_are_float32_values():
    opt, sched = scheduler("exp")
    run_rates(opt, sched, 3)
    lr = opt.param_groups[0]["lr"]
    assert lr == float(np.float32(lr))


def test_multistep_steps_once_per_iteration_past_repeated_values():
    opt, sched = scheduler("multistep", {"gamma": 0.5, "stepvalue": [1, 1, 1]})
    got = run_rates(opt, sched, 5)
    np.testing.assert_allclose(got, [0.1, 0.05, 0.025, 0.0125, 0.0125], rtol=1e-6)


def test_multistep_logs_caffes_status_line_at_each_step(caplog):
    """SGDSolver::GetLearningRate logs "MultiStep Status: Iteration N, step = K" when it
    moves current_step_, once per step taken."""
    with caplog.at_level("INFO", logger="torchcaffe.solver"):
        opt, sched = scheduler("multistep", {"gamma": 0.5, "stepvalue": [1, 1, 3]})
        run_rates(opt, sched, 6)
    assert [r.getMessage() for r in caplog.records] == [
        f"MultiStep Status: Iteration {it}, step = {k}" for it, k in ((1, 1), (2, 2), (3, 3))
    ]


@pytest.mark.parametrize("policy,k", [("step", 4), ("multistep", 6), ("poly", 5)])
def test_restore_resumes_the_same_rates(policy, k):
    opt, sched = scheduler(policy)
    full = run_rates(opt, sched, 11)
    opt, sched = scheduler(policy)
    run_rates(opt, sched, k)
    saved = (sched.last_epoch, sched.snapshot_step)
    opt2, sched2 = scheduler(policy)
    sched2.restore(*saved)
    np.testing.assert_allclose(run_rates(opt2, sched2, 11 - k), full[k:], rtol=1e-7)


def test_snapshot_step_is_caffe_current_step_after_the_last_update():
    """Caffe's solverstate holds current_step_ as left by GetLearningRate(iter_ - 1)."""
    opt, sched = scheduler("step", {"gamma": 0.5, "stepsize": 5})
    run_rates(opt, sched, 15)
    assert sched.snapshot_step == 14 // 5
    opt, sched = scheduler("multistep", {"gamma": 0.3, "stepvalue": [4, 9]})
    run_rates(opt, sched, 9)  # last update at iter 8: one step taken
    assert sched.snapshot_step == 1


def test_make_lr_policy_reads_the_solver_fields():
    param = caffe_pb2.SolverParameter(base_lr=BASE, lr_policy="multistep", gamma=0.3, type="SGD")
    param.stepvalue.extend([2, 5])
    assert policy_arguments("multistep", param)["stepvalue"] == [2, 5]
    net_free = [torch.nn.Parameter(torch.zeros(2))]
    from torchcaffe.solver.param_groups import Learnable

    opt = make_optimizer(param, [Learnable("l", 0, net_free[0], 1.0, 1.0)])
    sched = make_lr_policy(param, opt)
    assert type(sched).__name__ == "MultiStepPolicy"
    got = run_rates(opt, sched, 7)
    np.testing.assert_allclose(
        got, ref_rates("multistep", 7, {"gamma": 0.3, "stepvalue": [2, 5]}), rtol=1e-6
    )


def test_rates_where_python_float_arithmetic_would_fail_follow_c():
    """C's pow and exp give NaN or inf where Python's ``**`` turns complex or raises: poly
    past max_iter with a fractional power (a pycaffe loop stepping beyond max_iter), sigmoid
    long before its stepsize (gamma * stepsize > 709: a rate of 0, as in Caffe)."""
    opt, sched = scheduler("poly", {"power": 0.9, "max_iter": 3})
    got = run_rates(opt, sched, 5)
    np.testing.assert_allclose(got[:4], ref_rates("poly", 4, {"power": 0.9, "max_iter": 3}))
    assert math.isnan(got[4])
    opt, sched = scheduler("sigmoid", {"gamma": 0.01, "stepsize": 100000})
    assert run_rates(opt, sched, 2) == [0.0, 0.0]


def test_sigmoid_exponent_is_a_float32_product_as_caffe():
    """Caffe's sigmoid rate is base_lr / (1 + exp(-gamma * (Dtype(iter_) - Dtype(stepsize)))):
    the exponent is a float product. Taken in double, about a quarter of the rates of this
    warm-up came out one float32 ulp off Caffe's."""
    f = np.float32
    gamma, stepsize = 0.001, 500
    opt, sched = scheduler("sigmoid", {"gamma": gamma, "stepsize": stepsize})
    got = run_rates(opt, sched, 1000)
    want = [
        f(f(BASE) * (1.0 / (1.0 + np.exp(np.float64(-f(gamma) * f(f(it) - f(stepsize)))))))
        for it in range(1000)
    ]
    assert got == [float(w) for w in want]
