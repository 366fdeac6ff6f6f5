"""``torchcaffe.param_groups``: Caffe's lr_mult / decay_mult for any torch optimizer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import torchcaffe

NET = """
name: "mults"
input: "data" input_shape { dim: 2 dim: 3 }
layer { name: "frozen" type: "InnerProduct" bottom: "data" top: "a"
        param { lr_mult: 0 } param { lr_mult: 0 }
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "constant" value: 0.5 } } }
layer { name: "ip" type: "InnerProduct" bottom: "a" top: "b"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "constant" value: 0.5 } } }
"""


@pytest.fixture
def net(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    torch.manual_seed(0)
    return torchcaffe.load(path, phase="train")


def params(net):
    return {
        name: [t.detach().clone() for t in net.layer(name).param_blobs()]
        for name in ("frozen", "ip")
    }


def test_groups_carry_multiplied_rates_and_decays(net):
    groups = torchcaffe.param_groups(net, lr=0.01, weight_decay=0.1, betas=(0.8, 0.9))
    weight, bias = net.layer("ip").param_blobs()
    assert [(g["multipliers"], g["lr"], g["weight_decay"]) for g in groups] == [
        ((1.0, 1.0), 0.01, 0.1),
        ((2.0, 0.0), 0.02, 0.0),
    ]
    assert groups[0]["params"] == [weight] and groups[1]["params"] == [bias]
    assert all(g["betas"] == (0.8, 0.9) for g in groups)
    frozen = {id(t) for t in net.layer("frozen").param_blobs()}
    assert not any(id(p) in frozen for g in groups for p in g["params"])  # lr_mult 0: left out


def test_adamw_step_respects_lr_mult_0_and_2_and_decay_mult_0(net):
    """One AdamW step: Adam's first step moves every entry by lr (times lr_mult) in the sign of
    its gradient; decoupled decay shrinks by lr*wd where decay_mult is 1, not where it is 0."""
    lr, wd = 0.01, 0.5
    before = params(net)
    opt = torch.optim.AdamW(torchcaffe.param_groups(net, lr=lr, weight_decay=wd))
    out = net(data=torch.randn(2, 3))["b"]
    (out * torch.tensor([1.0, -2.0])).sum().backward()
    weight, bias = net.layer("ip").param_blobs()
    grad_w, grad_b = weight.grad.clone(), bias.grad.clone()
    opt.step()
    after = params(net)
    for old, new in zip(before["frozen"], after["frozen"]):
        torch.testing.assert_close(new, old, rtol=0, atol=0)  # lr_mult 0: never moves
    eps = 1e-8
    adam = lambda g: g / (g.abs() + eps)  # noqa: E731 -- Adam's first bias-corrected step
    want_w = before["ip"][0] * (1 - lr * wd) - lr * adam(grad_w)  # decay_mult 1, lr_mult 1
    want_b = before["ip"][1] - 2 * lr * adam(grad_b)  # decay_mult 0, lr_mult 2
    torch.testing.assert_close(after["ip"][0], want_w)
    torch.testing.assert_close(after["ip"][1], want_b)


def test_schedulers_keep_the_multipliers_proportional(net):
    opt = torch.optim.AdamW(torchcaffe.param_groups(net, lr=0.1, weight_decay=0.01))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    for _ in range(3):
        opt.step()
        sched.step()
    rates = [g["lr"] for g in opt.param_groups]
    assert rates[0] < 0.1
    assert rates[1] == pytest.approx(2 * rates[0])
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]


def test_readme_adamw_cosine_recipe_trains_and_keeps_the_multipliers(net, tmp_path):
    """The README's recipe, run as written: the loss falls, the rate ends at the cosine's
    floor, lr_mult 0 params never move and lr_mult 2 keeps twice the rate."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    recipe = next(b for b in blocks if "AdamW" in b and "CosineAnnealingLR" in b)
    path = tmp_path / "loss.prototxt"
    inputs = """layer { name: "in" type: "Input" top: "data" top: "label"
                        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }"""
    loss = 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "b" bottom: "label" }'
    path.write_text(NET.replace('input: "data" input_shape { dim: 2 dim: 3 }', inputs) + loss)
    torch.manual_seed(0)
    net = torchcaffe.load(path, phase="train")
    data, label = torch.randn(4, 3), torch.tensor([0.0, 1.0, 1.0, 0.0])
    steps = 30
    before = params(net)

    def objective() -> float:
        with torch.no_grad():
            return float(net.total_loss(net.forward_all_blobs(data=data, label=label)))

    first = objective()
    batches = [(data, label)] * steps
    scope = {"torch": torch, "torchcaffe": torchcaffe, "net": net, "steps": steps}
    exec(recipe, scope | {"batches": batches}, scope)
    assert objective() < first
    rates = [group["lr"] for group in scope["opt"].param_groups]
    assert rates == [0.0] * len(rates)  # T_max steps: the cosine reached 0
    for old, new in zip(before["frozen"], params(net)["frozen"]):
        assert torch.equal(old, new)
    assert not torch.equal(before["ip"][1], params(net)["ip"][1])
