"""Training passes (torchcaffe/net/passes/training.py): they fire on forwards that autograd
records and keep outputs, gradients and BatchNorm's running statistics as the layer-by-layer
program computes them (rtol 1e-4, atol 1e-5, the golden tolerance)."""

from __future__ import annotations

import copy
import dataclasses
import operator

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from google.protobuf import text_format

import torchcaffe
from torchcaffe.net.passes import TRAINING_PASSES, OptimizedProgram, training
from torchcaffe.net.passes.training import FrozenBatchNormFold, bypass_splits_for_training
from torchcaffe.proto import caffe_pb2

from ..helpers.counting import count_calls
from ..helpers.graphs import traced_calls

FUSE, RELU = "fuse_batchnorm_scale_for_training", "inplace_relu_for_training"
FOLD = "fold_frozen_batchnorm_for_training"
SPLIT = "bypass_splits_for_training"
RTOL, ATOL = 1e-4, 1e-5

NET = """
name: "t"
input: "data" input_shape { dim: 4 dim: 3 dim: 6 dim: 5 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false
    weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "sc" type: "Scale" bottom: "c" top: "c"
  scale_param { bias_term: true filler { type: "uniform" min: 0.5 max: 1.5 }
    bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "sig" type: "Sigmoid" bottom: "c" top: "s" }
layer { name: "relu_s" type: "ReLU" bottom: "s" top: "s" }
layer { name: "ip" type: "InnerProduct" bottom: "s" top: "out"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
"""


def _net() -> torchcaffe.TorchNet:
    torch.manual_seed(0)
    return torchcaffe.load(text_format.Parse(NET, caffe_pb2.NetParameter()), phase="train")


def _step(net: torchcaffe.TorchNet, x: torch.Tensor, optimize: bool):
    net.optimize = optimize
    net.zero_grad()
    x = x.detach().requires_grad_()
    out = net(data=x)["out"]
    (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    grads["data"] = x.grad.clone()
    stats = {n: b.clone() for n, b in net.named_buffers()}
    return out.detach(), grads, stats


def _assert_step_equal(net: torchcaffe.TorchNet, x: torch.Tensor) -> None:
    """One optimized step of ``net`` equals one layer-by-layer step of a copy: outputs, every
    param's and the input's gradient, the statistics."""
    twin = copy.deepcopy(net)
    got, want = _step(net, x, optimize=True), _step(twin, x, optimize=False)
    for part in range(1, 3):
        assert got[part].keys() == want[part].keys()
        for name in want[part]:
            _close(got[part][name], want[part][name])
    _close(got[0], want[0])


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RTOL, atol=ATOL)


def test_passes_are_listed_in_order():
    assert [p.__name__ for p in TRAINING_PASSES] == [FOLD, FUSE, SPLIT, RELU]


def test_training_passes_fire_and_keep_outputs_grads_and_statistics():
    net = _net()
    report = net.training_program().report
    assert report[FUSE] == 1  # bn + sc
    assert report[RELU] == 1  # relu after the fused pair; not relu_s (Sigmoid keeps its output)
    twin = copy.deepcopy(net)
    x = torch.randn(4, 3, 6, 5)
    for _ in range(2):  # the second step reads the running statistics the first updated
        got = _step(net, x, optimize=True)
        want = _step(twin, x, optimize=False)
        _close(got[0], want[0])
        for name in want[1]:
            _close(got[1][name], want[1][name])
        for name in want[2]:
            _close(got[2][name], want[2][name])
    assert net.layers["bn"].scale_factor.item() == twin.layers["bn"].scale_factor.item() > 1


def test_an_observable_batchnorm_top_is_not_fused():
    text = (
        NET.replace(
            'name: "bn" type: "BatchNorm" bottom: "c" top: "c"',
            'name: "bn" type: "BatchNorm" bottom: "c" top: "n"',
        )
        .replace(
            'name: "sc" type: "Scale" bottom: "c" top: "c"',
            'name: "sc" type: "Scale" bottom: "n" top: "m"',
        )
        .replace(
            'name: "relu" type: "ReLU" bottom: "c" top: "c"',
            'name: "relu" type: "ReLU" bottom: "m" top: "m"',
        )
        .replace('bottom: "c" top: "s"', 'bottom: "m" top: "s"')
    )
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="train")
    assert net.training_program().report[FUSE] == 1
    assert net.training_program(["out", "n"]).report[FUSE] == 0
    blobs = net.forward_all_blobs(data=torch.randn(4, 3, 6, 5))
    assert blobs["n"].shape == blobs["m"].shape and not torch.equal(blobs["n"], blobs["m"])


def test_inference_and_training_programs_are_chosen_by_autograd():
    net = _net()
    x = torch.randn(4, 3, 6, 5)
    with torch.no_grad():
        net(data=x)
    net(data=x)
    kinds = {key[2] for key in net._programs}
    assert kinds == {False, True}


def test_a_frozen_net_with_grad_enabled_runs_the_inference_program():
    """Grad enabled but nothing requiring it (``requires_grad_(False)``, an input that does
    not): autograd records nothing, so the inference program runs, as under no_grad. A flag
    set again is seen on the next call: that param gets its gradient, the literal one."""
    net = _frozen().eval()
    net.requires_grad_(False)
    x = torch.randn(4, 3, 6, 5)
    with torch.no_grad():
        want = net(data=x)["out"]
    got = net(data=x)["out"]
    assert {key[2] for key in net._programs} == {False} and not got.requires_grad
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    weight = net.layers["sc"].weight
    weight.requires_grad_(True)
    net(data=x)["out"].sum().backward()
    assert {key[2] for key in net._programs} == {False, True}
    literal = copy.deepcopy(net)
    literal.optimize = False
    literal.layers["sc"].weight.grad = None
    literal(data=x)["out"].sum().backward()
    torch.testing.assert_close(weight.grad, literal.layers["sc"].weight.grad, rtol=RTOL, atol=ATOL)
    weight.grad = None
    net(data=x.requires_grad_())["out"].sum().backward()  # an input needing grad records
    assert x.grad is not None and weight.grad is not None


SCALE = NET[NET.index('layer { name: "sc"') : NET.index('layer { name: "relu"')]
BIAS = """layer { name: "sc" type: "Bias" bottom: "c" top: "c"
  bias_param { filler { type: "uniform" min: -0.5 max: 0.5 } } }
"""


def _frozen(text: str = NET, factor: float = 2.0) -> torchcaffe.TorchNet:
    """NET with the BatchNorm's statistics frozen (use_global_stats) and set."""
    text = text.replace(
        'type: "BatchNorm" bottom: "c" top: "c" }',
        'type: "BatchNorm" bottom: "c" top: "c" batch_norm_param { use_global_stats: true } }',
    )
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="train")
    with torch.no_grad():
        net.layers["bn"].mean.uniform_(-0.5, 0.5)
        net.layers["bn"].variance.uniform_(0.5, 1.5)
        net.layers["bn"].scale_factor.fill_(factor)
    return net


def test_frozen_batchnorm_and_scale_fold_into_the_convolution():
    net = _frozen()
    program = net.training_program()
    assert program.report[FOLD] == 1 and program.report[FUSE] == 0
    assert [s.type for s in program.steps][1] == "Convolution+BatchNorm+Scale"
    assert program.report[RELU] == 1  # the folded convolution's backward keeps its output free
    _assert_step_equal(net, torch.randn(4, 3, 6, 5))


@pytest.mark.parametrize("factor", [1.0, 2.0])
@pytest.mark.parametrize(
    "edit",
    [
        ("bias_term: false", "bias_term: true bias_filler { type: 'gaussian' std: 0.3 }"),
        ("scale_param { bias_term: true", "scale_param { bias_term: false"),
        (SCALE, BIAS),
    ],
    ids=["conv-bias", "scale-without-bias", "bias-instead-of-scale"],
)
def test_every_chain_shape_folds_with_the_same_gradients(edit, factor):
    net = _frozen(NET.replace(*edit), factor)
    assert net.training_program().report[FOLD] == 1
    _assert_step_equal(net, torch.randn(4, 3, 6, 5))


def test_an_infinite_scale_runs_the_chain_as_caffe_does():
    """gamma = inf folds into +-inf filters whose products sum to NaN; Caffe's Scale gives
    +-inf there, which the ReLU and Sigmoid after it make finite again."""
    net = _frozen()
    with torch.no_grad():
        net.layers["sc"].weight[1] = float("inf")
    assert net.training_program().report[FOLD] == 1
    x = torch.randn(4, 3, 6, 5, requires_grad=True)
    got = net.forward_all_blobs(data=x)
    net.optimize = False
    want = net.forward_all_blobs(data=x)
    assert torch.isinf(want["c"][:, 1]).any() and not torch.isnan(want["out"]).any()
    for name in want:
        np.testing.assert_allclose(
            got[name].detach().numpy(), want[name].detach().numpy(), rtol=RTOL, atol=ATOL
        )


def test_batch_statistics_are_not_folded():
    assert _net().training_program().report[FOLD] == 0


def test_a_batchnorm_switched_to_batch_statistics_later_runs_the_chain():
    net = _frozen()
    net.layers["bn"].use_global_stats = None  # as if unset in the prototxt
    net.layers["bn"].eval()
    assert net.training_program().report[FOLD] == 1  # built while the statistics are global
    net.layers["bn"].train()  # this layer alone: the cached program stays
    twin = copy.deepcopy(net)
    x = torch.randn(4, 3, 6, 5)
    got, want = _step(net, x, optimize=True), _step(twin, x, optimize=False)
    _close(got[0], want[0])
    for part in (1, 2):
        for name in want[part]:
            _close(got[part][name], want[part][name])
    assert net.layers["bn"].scale_factor.item() > 2.0  # the batch statistics were taken


def test_a_stopped_gradient_in_the_chain_is_not_folded():
    text = NET.replace(
        'name: "sc" type: "Scale" bottom: "c" top: "c"',
        'name: "sc" type: "Scale" bottom: "c" top: "c" propagate_down: false',
    )
    assert _frozen(text).training_program().report[FOLD] == 0


# data is read twice (conv, the shortcut) and so is the ReLU's output r: Caffe inserts a Split
# for each. The ReLU after the Eltwise SUM runs in place; the one after the PROD follows a
# Sigmoid (whose backward reads its output), so it stays out of place.
RESIDUAL = """
name: "r"
input: "data" input_shape { dim: 2 dim: 3 dim: 5 dim: 4 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 3 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "sum" type: "Eltwise" bottom: "c" bottom: "data" top: "e"
  eltwise_param { coeff: 1 coeff: -0.5 } }
layer { name: "relu" type: "ReLU" bottom: "e" top: "e" }
layer { name: "sig" type: "Sigmoid" bottom: "e" top: "g" }
layer { name: "prod" type: "Eltwise" bottom: "e" bottom: "g" top: "r"
  eltwise_param { operation: PROD } }
layer { name: "relu_r" type: "ReLU" bottom: "r" top: "r" }
layer { name: "ip" type: "InnerProduct" bottom: "r" top: "o1"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "r" top: "o2"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "out" type: "Eltwise" bottom: "o1" bottom: "o2" top: "out" }
"""


def _residual(text: str = RESIDUAL) -> torchcaffe.TorchNet:
    torch.manual_seed(0)
    return torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="train")


def test_splits_bypassed_and_relus_after_eltwise_in_place_keep_grads():
    net = _residual()
    assert sum(s.type == "Split" for s in net.steps) == 3  # data, e, r
    program = net.training_program()
    assert program.report[SPLIT] == 3
    assert not any(s.type == "Split" for s in program.steps)
    readers = [s.bottoms for s in program.steps if s.name in ("conv", "sum", "ip", "ip2")]
    assert readers == [("data",), ("c", "data"), ("r",), ("r",)]
    assert program.report[RELU] == 2  # relu (after SUM) and relu_r (after PROD)
    _assert_step_equal(net, torch.randn(2, 3, 5, 4))


def test_an_observable_split_top_is_kept():
    net = _residual()
    split = next(s for s in net.steps if s.type == "Split" and s.bottoms == ("r",))
    program = net.training_program(["out", split.tops[0]])
    assert program.report[SPLIT] == 2
    assert [s for s in program.steps if s.type == "Split"] == [split]


def test_relu_after_a_prod_with_caffes_unstable_gradient_stays_out_of_place():
    net = _residual(
        RESIDUAL.replace("operation: PROD }", "operation: PROD stable_prod_grad: false }")
    )
    relus = [s.name for s in net.training_program().steps if s.type == "ReLU+inplace"]
    assert relus == ["relu"]  # relu_r's producer saves its top for backward
    _assert_step_equal(net, torch.randn(2, 3, 5, 4))


@pytest.mark.parametrize("operation", ["SUM", "MAX", "PROD"])
def test_relu_after_an_eltwise_in_place_stays_out_of_place(operation):
    """An Eltwise written over bottom 0 (Caffe's in-place form) saves its top for backward:
    a ReLU overwriting that top would fail autograd's version check."""
    text = RESIDUAL.replace('bottom: "data" top: "e"', 'bottom: "data" top: "c"')
    text = text.replace('bottom: "e" top: "e" }', 'bottom: "c" top: "c" }')
    text = text.replace('bottom: "e" top: "g"', 'bottom: "c" top: "g"')
    text = text.replace('bottom: "e" bottom: "g"', 'bottom: "c" bottom: "g"')
    text = text.replace(
        "eltwise_param { coeff: 1 coeff: -0.5 }", f"eltwise_param {{ operation: {operation} }}"
    )
    net = _residual(text)
    relus = [s.name for s in net.training_program().steps if s.type == "ReLU+inplace"]
    assert relus == ["relu_r"]
    _assert_step_equal(net, torch.randn(2, 3, 5, 4))


def test_a_split_whose_bottom_is_rewritten_before_its_readers_is_kept():
    # Caffe's wiring never rewrites a Split's bottom while its tops are read (in-place readers
    # get the Split's names), so the program is edited by hand: "sig" now overwrites e between
    # the Split of e and the readers of its tops, which must still see the old e.
    net = _residual()
    steps = [dataclasses.replace(s, tops=("e",)) if s.name == "sig" else s for s in net.steps]
    program = OptimizedProgram.unoptimized(steps, net.layers)
    out = bypass_splits_for_training(program, frozenset({"out"}))
    assert out.report[SPLIT] == 2  # data and r
    assert [s.bottoms for s in out.steps if s.type == "Split"] == [("e",)]


def test_compiled_frozen_fold_keeps_every_gradient_at_batch_one():
    """Under torch.compile the inference fold's batch-1 path folds detached links; the training
    fold keeps its own differentiable weights there (the Scale's gradients reach it)."""
    net = _frozen()
    x = torch.randn(1, 3, 6, 5)
    fold = net.training_program().runners["conv+frozen-folded"]
    assert type(fold).__name__ == "FrozenBatchNormFold"
    twin = copy.deepcopy(net)
    want = _step(twin, x, optimize=False)
    compiled = torch.compile(net, backend="aot_eager", fullgraph=True)
    net.optimize = True
    net.zero_grad()
    xg = x.clone().requires_grad_()
    out = compiled(data=xg)["out"]
    (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
    _close(out.detach(), want[0])
    for name, p in net.named_parameters():
        _close(p.grad, want[1][name])
    _close(xg.grad, want[1]["data"])


def _conv_biases_in_training_graph(net: torchcaffe.TorchNet, x: torch.Tensor) -> list:
    """The bias argument of each convolution in dynamo's graph of a recorded forward."""
    convs = [n for n in traced_calls(net, grad=True, data=x) if n.target is torch.conv2d]
    return [n.args[2] if len(n.args) > 2 else n.kwargs.get("bias") for n in convs]


def test_compiled_frozen_fold_adds_its_bias_after_the_convolution():
    """In a compiled training graph the folded bias is an op after the convolution (inductor
    fuses it and its gradient's sum into the ops around it); the step keeps its values."""
    net = _frozen()
    x = torch.randn(2, 3, 6, 5)
    assert _conv_biases_in_training_graph(net, x) == [None]
    twin = copy.deepcopy(net)
    want = _step(twin, x, optimize=False)
    compiled = torch.compile(net, backend="aot_eager", fullgraph=True)
    net.optimize = True
    net.zero_grad()
    out = compiled(data=x)["out"]
    (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
    _close(out.detach(), want[0])
    for name, p in net.named_parameters():
        _close(p.grad, want[1][name])


def test_compiled_frozen_fold_computes_its_affine_once_as_one_stacked_buffer():
    """In a compiled training graph the chain's (a, c) are stacked (one buffer inductor computes
    once) and both the weight scaling and the bias read that stack's rows."""
    calls = traced_calls(_frozen(), grad=True, data=torch.randn(2, 3, 6, 5))
    stacks = [n for n in calls if n.target is torch.stack]
    assert len(stacks) == 1
    rows = [n for n in calls if n.target is operator.getitem and n.args[0] is stacks[0]]
    assert sorted(n.args[1] for n in rows) == [0, 1]
    assert all(n.users for n in rows)


def test_compiled_frozen_fold_keeps_the_bias_in_the_convolution_under_autocast():
    """Under autocast the convolution rounds its top: the folded bias stays its argument."""
    with torch.autocast("cpu", torch.bfloat16):
        biases = _conv_biases_in_training_graph(_frozen(), torch.randn(2, 3, 6, 5))
    assert len(biases) == 1 and biases[0] is not None


@pytest.mark.parametrize("batch, switched", [(4, False), (1, True)])
def test_frozen_fold_over_a_small_top_runs_the_convolution_then_one_batch_norm(
    monkeypatch, batch, switched
):
    """Where the convolution's weight holds WEIGHT_PER_TOP times its top's values or more
    (batch 1 over a small plane: ResNet-50's last stage), scaling the weight costs more than
    BatchNorm over the top: the convolution runs, then BatchNorm and Scale as one
    F.batch_norm, with the same step (outputs, every gradient)."""
    net = _frozen(NET.replace("kernel_size: 3 pad: 1", "kernel_size: 5 pad: 2"))  # 300 weights
    monkeypatch.setattr(training, "WEIGHT_PER_TOP", 2)  # 300 / 120 at batch 1, 300 / 480 at 4
    calls = count_calls(monkeypatch, FrozenBatchNormFold, "producer_then_batch_norm")
    _assert_step_equal(net, torch.randn(batch, 3, 6, 5))  # a top of batch * 120 values
    assert calls[0] == switched


def test_frozen_fold_off_the_cpu_runs_the_convolution_then_one_batch_norm(monkeypatch):
    """On a GPU the differentiable fold's small ops bound the step by their launches: there
    the convolution runs, then BatchNorm + Scale as one F.batch_norm, with the same step."""
    net = _frozen()
    fold = net.training_program().runners["conv+frozen-folded"]
    assert not fold.launch_bound(torch.randn(1, 3, 6, 5))  # the CPU keeps the fold
    assert fold.launch_bound(torch.randn(1, 3, 6, 5, device="meta"))
    monkeypatch.setattr(type(fold), "launch_bound", lambda self, x: True)

    def no_fold(self):
        raise AssertionError("folded the weights")

    monkeypatch.setattr(type(fold), "folded_weights", no_fold)
    with_scale = []  # F.batch_norm calls given the Scale's weight (the literal's have none)
    batch_norm = F.batch_norm

    def counted(x, mean, var, weight=None, *args, **kwargs):
        with_scale.append(weight is not None)
        return batch_norm(x, mean, var, weight, *args, **kwargs)

    monkeypatch.setattr(F, "batch_norm", counted)
    _assert_step_equal(net, torch.randn(2, 3, 6, 5))
    assert sum(with_scale) == 1


def test_frozen_fold_off_the_cpu_runs_under_autocast(monkeypatch):
    """The GPU's form of a frozen fold (the convolution, then one F.batch_norm) under
    autocast, here the CPU's (bfloat16): the convolution's top is bfloat16 and the Scale's
    params float32, so the statistics go to F.batch_norm in float32 (in bfloat16 torch
    refuses the mix). Gradients stay within bfloat16's error of float32's."""
    net = _frozen()
    monkeypatch.setattr(FrozenBatchNormFold, "launch_bound", lambda self, x: True)
    calls = count_calls(monkeypatch, FrozenBatchNormFold, "producer_then_batch_norm")
    x = torch.randn(4, 3, 6, 5)
    _, want, _ = _step(copy.deepcopy(net), x, optimize=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, got, _ = _step(net, x, optimize=True)
    assert calls[0]
    for name, g in want.items():
        assert (got[name] - g).abs().max() <= 0.05 * g.abs().max(), name


def test_fused_batchnorm_scale_runs_under_cpu_autocast():
    """Under ``torch.autocast('cpu', bfloat16)`` the convolution's top is bfloat16 and the
    Scale's params float32: the fused ``F.batch_norm`` takes its statistics in float32 (in
    bfloat16 torch refuses the mix). Gradients stay within bfloat16's error of float32's."""
    net = _net()
    x = torch.randn(4, 3, 6, 5)
    _, want, _ = _step(copy.deepcopy(net), x, optimize=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, got, _ = _step(net, x, optimize=True)
    for name, g in want.items():
        assert (got[name] - g).abs().max() <= 0.05 * g.abs().max(), name
