"""direct_calls (torchcaffe/net/passes/direct_calls.py): off the CPU, Convolution and
InnerProduct steps (with their fused ReLU) and MAX/AVE poolings run as direct torch calls,
with Caffe's values; the geometries torch cannot express go to the layer. The programs are
a GPU's, run here on CPU tensors (``off_cpu_programs``) and on the meta device."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from google.protobuf import text_format

import torchcaffe
from torchcaffe.net.passes.direct_calls import DirectConv2d, DirectFrozenFold, DirectPool2d
from torchcaffe.ops.convolution import ConvolutionLayer
from torchcaffe.ops.pooling import FLT_MAX, PoolingLayer
from torchcaffe.proto import caffe_pb2

from ..helpers.counting import count_calls
from ..helpers.params import fill_params
from ..helpers.programs import literal_blobs, off_cpu_programs

NET = """
input: "data" input_shape { dim: 2 dim: 3 dim: 12 dim: 12 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 6 kernel_size: 3 pad: 1 } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "pool" type: "Pooling" bottom: "c" top: "p"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "p" top: "c2"
  convolution_param { num_output: 4 kernel_size: 1 bias_term: false } }
layer { name: "leaky" type: "ReLU" bottom: "c2" top: "c2" relu_param { negative_slope: 0.1 } }
layer { name: "ave" type: "Pooling" bottom: "c2" top: "a"
  pooling_param { pool: AVE kernel_size: 2 stride: 2 pad: 1 } }
layer { name: "conv3" type: "Convolution" bottom: "a" top: "c3"
  convolution_param { num_output: 5 kernel_size: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "c3" top: "f"
  inner_product_param { num_output: 7 } }
layer { name: "relu3" type: "ReLU" bottom: "f" top: "f" }
layer { name: "ipt" type: "InnerProduct" bottom: "f" top: "g"
  inner_product_param { num_output: 3 transpose: true } }
layer { name: "prob" type: "Softmax" bottom: "g" top: "prob" }
"""
DIRECT = {"conv", "pool", "conv2", "ave", "conv3", "ip", "ipt"}


def _net(text: str = NET) -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="test")
    fill_params(net, lambda t, gen: torch.rand(t.shape, generator=gen) - 0.4, seed=3)
    return net.eval()


def _direct_steps(program) -> set[str]:
    return {s.name for s in program.steps if s.key.endswith("+direct")}


def test_the_pass_runs_off_the_cpu_only_and_takes_each_product_and_pooling():
    net = _net()
    assert "direct_calls" not in net.optimized_program().report
    meta = net.optimized_program(device=torch.device("meta"))
    assert meta.report["direct_calls"] == len(DIRECT) and _direct_steps(meta) == DIRECT
    assert meta.finite_steps == 0  # no finite forms off the CPU: the run checks nothing
    training = net.training_program(device=torch.device("meta"))
    assert _direct_steps(training) == DIRECT
    for program in (meta, training):  # a trace by torch.compile calls the layers
        for step in program.steps:
            runner = program.runners[step.key]
            if step.name in _direct_steps(program):
                inner = getattr(runner, "fallback", getattr(runner, "layer", None))
                assert program.traced_runners[step.key] is inner


def test_a_run_on_the_meta_device_goes_through_the_direct_calls(monkeypatch):
    net = _net().to("meta")
    convs = count_calls(monkeypatch, DirectConv2d, "__call__")
    pools = count_calls(monkeypatch, DirectPool2d, "__call__")
    layer_pools = count_calls(monkeypatch, PoolingLayer, "forward")
    with torch.inference_mode():
        out = net(data=torch.empty(2, 3, 12, 12, device="meta"))
    assert out["prob"].shape == (2, 3) and out["prob"].device.type == "meta"
    assert (convs[0], pools[0], layer_pools[0]) == (3, 2, 0)


@pytest.mark.parametrize("shape", [(2, 3, 12, 12), (1, 3, 13, 11)])
def test_values_are_the_layers_nan_and_infinity_included(monkeypatch, shape):
    """Inputs with NaN and +-inf: MAX never picks NaN (a window of NaN alone gives -FLT_MAX)."""
    text = NET.replace("dim: 2 dim: 3 dim: 12 dim: 12", " ".join(f"dim: {d}" for d in shape))
    net = _net(text)
    x = torch.randn(shape)
    x[0, :, :5, :5] = float("nan")
    x[-1, 1, 3, :] = float("inf")
    x[-1, 2, :, 4] = -float("inf")
    want = literal_blobs(net, x)
    off_cpu_programs(monkeypatch, net)
    with torch.inference_mode():
        got = net.forward_all_blobs(data=x)
        out = net(data=x)
    assert _direct_steps(net.optimized_program()) == DIRECT
    assert (want["p"] == -FLT_MAX).any()  # a window of NaN alone
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(out["prob"], want["prob"], rtol=1e-5, atol=1e-6)


def test_geometries_torch_cannot_express_go_to_the_layer(monkeypatch):
    """A pad past half the kernel (explicit padding), a bottom smaller than the convolution's
    kernel (C's division gives one output over zeros past the end), a global pooling over
    bottoms of two sizes (one plan each)."""
    text = """
    input: "data" input_shape { dim: 1 dim: 2 dim: 4 dim: 4 }
    layer { name: "wide" type: "Convolution" bottom: "data" top: "w"
      convolution_param { num_output: 3 kernel_size: 5 stride: 2 } }
    layer { name: "pad" type: "Pooling" bottom: "data" top: "p"
      pooling_param { pool: MAX kernel_size: 3 pad: 2 stride: 2 } }
    layer { name: "glob" type: "Pooling" bottom: "p" top: "g"
      pooling_param { pool: AVE global_pooling: true } }
    """
    net = _net(text)
    off_cpu_programs(monkeypatch, net)
    layer_pools = count_calls(monkeypatch, PoolingLayer, "forward")
    layer_convs = count_calls(monkeypatch, ConvolutionLayer, "forward")
    for hw, wide_by_layer in ((4, 1), (7, 0)):
        x = torch.randn(1, 2, hw, hw)
        want = literal_blobs(net, x)
        pools, convs = layer_pools[0], layer_convs[0]
        with torch.inference_mode():
            got = net.forward_all_blobs(data=x)
        assert layer_pools[0] - pools == 1  # "pad" only; "glob" is torch's own
        assert layer_convs[0] - convs == wide_by_layer  # 4x4 needs Caffe's extra pad
        for name, value in want.items():
            assert got[name].shape == value.shape, name
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)
    runners = net.optimized_program(net.blob_names).runners
    assert len(runners["glob+direct"].plans) == 2
    assert None not in runners["glob+direct"].plans.values()
    assert set(runners["pad+direct"].plans.values()) == {None}


def test_gradients_through_the_direct_products_are_the_layers(monkeypatch):
    net = _net()
    x = torch.randn(2, 3, 12, 12)
    w = torch.randn(2, 3)

    def grads() -> list[torch.Tensor]:
        net.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_(True)
        (net(data=xg)["prob"] * w).sum().backward()
        return [xg.grad] + [p.grad for p in net.parameters()]

    net.optimize = False
    want = grads()
    net.optimize = True
    off_cpu_programs(monkeypatch, net)
    got = grads()
    assert _direct_steps(net.training_program()) == DIRECT
    for g, v in zip(got, want):
        np.testing.assert_allclose(g, v, rtol=1e-5, atol=1e-6)


def test_an_eager_run_calls_a_layers_forward_and_one_given_later():
    net = _net()
    program = net.optimized_program()
    runners = {
        step.name: entry[0]
        for step, entry in zip([s for s in program.steps if not s.is_input], program.eager_walk)
    }
    softmax = net.layer("prob")
    assert runners["prob"] == softmax.forward
    calls = []
    own = softmax.forward
    softmax.forward = lambda x: calls.append(1) or own(x)  # the program stays made
    with torch.inference_mode():
        net(data=torch.randn(2, 3, 12, 12))
    assert calls == [1]


FOLDED = """
input: "data" input_shape { dim: 2 dim: 3 dim: 8 dim: 8 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "scale" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "conv2" type: "Convolution" bottom: "c" top: "d"
  convolution_param { num_output: 3 kernel_size: 1 } }
layer { name: "bn2" type: "BatchNorm" bottom: "d" top: "d" }
layer { name: "scale2" type: "Scale" bottom: "d" top: "d" scale_param { bias_term: true } }
"""


def _folded_net() -> torchcaffe.TorchNet:
    net = _net(FOLDED)
    with torch.no_grad():
        for name in ("bn", "bn2"):
            mean, var, factor = net.layer(name).param_blobs()
            var.abs_().add_(0.5)
            factor.fill_(2.0)
    return net


def test_folds_into_convolutions_run_as_direct_calls(monkeypatch):
    net = _folded_net()
    meta = torch.device("meta")
    inference = net.optimized_program(device=meta).runners
    training = net.training_program(device=meta).runners
    assert {type(r).__name__ for k, r in inference.items() if k.endswith("+direct")} == {
        "DirectFoldedConv2d"
    }
    assert {type(r).__name__ for k, r in training.items() if k.endswith("+direct")} == {
        "DirectFrozenFold"
    }
    x = torch.randn(2, 3, 8, 8)
    want = literal_blobs(net, x)["d"]
    off_cpu_programs(monkeypatch, net)
    with torch.inference_mode():
        np.testing.assert_allclose(net(data=x)["d"], want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # an infinite Scale: Caffe's +-inf, where folded filters give NaN
        net.layer("scale").param_blobs()[0][1] = float("inf")
    want = literal_blobs(net, x)["d"]
    assert torch.isinf(want).any() or torch.isnan(want).any()
    with torch.inference_mode():
        np.testing.assert_allclose(net(data=x)["d"], want, rtol=1e-5, atol=1e-5)


def test_a_frozen_fold_differentiates_as_the_layers_and_batch_statistics_fold_nothing(
    monkeypatch,
):
    net = _folded_net()
    x = torch.randn(2, 3, 8, 8)

    def grads() -> list[torch.Tensor]:
        net.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_(True)
        out = net(data=xg)["d"]
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
        return [out.detach(), xg.grad] + [p.grad for p in net.parameters() if p.requires_grad]

    net.optimize = False
    want = grads()
    net.optimize = True
    off_cpu_programs(monkeypatch, net)
    direct = count_calls(monkeypatch, torch.nn.functional, "batch_norm")
    got = grads()
    assert direct[0] == 2  # one batch norm after each convolution
    for g, v in zip(got, want):
        np.testing.assert_allclose(g, v, rtol=1e-4, atol=1e-5)
    net.train()  # TRAIN BatchNorm: batch statistics, the layers one by one
    net.optimize = False
    want = grads()
    net.optimize = True
    got = grads()
    runners = net.training_program().runners.values()
    assert not any(isinstance(r, DirectFrozenFold) for r in runners)  # nothing frozen now
    for g, v in zip(got, want):  # the biases before a BatchNorm get ~0: absolute 1e-4
        np.testing.assert_allclose(g, v, rtol=1e-4, atol=1e-4)


def test_a_max_pooling_autograd_records_sends_no_gradient_to_nan_as_caffes_mask(monkeypatch):
    text = """
    input: "data" input_shape { dim: 1 dim: 2 dim: 6 dim: 6 }
    layer { name: "pool" type: "Pooling" bottom: "data" top: "p"
      pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
    """
    net = _net(text)
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, :3, :3] = float("nan")  # a window of NaN alone: -FLT_MAX, no gradient
    x[0, 1, 1, 1] = float("nan")  # beside values: the best of those gets it
    x[0, 1, 4, :] = -float("inf")
    x[0, 0, 5, 5] = float("inf")  # wins its windows, and their gradient

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        xg = x.clone().requires_grad_(True)
        out = net(data=xg)["p"]
        out.backward(torch.ones_like(out))
        return out.detach(), xg.grad

    net.optimize = False
    want = run()
    net.optimize = True
    off_cpu_programs(monkeypatch, net)
    got = run()
    assert _direct_steps(net.training_program()) == {"pool"}
    assert (want[0] == -FLT_MAX).any() and not torch.isnan(want[1]).any()
    assert want[1][0, 0, 5, 5] > 0
    for g, v in zip(got, want):
        assert torch.equal(g, v)


@pytest.mark.parametrize("which", ["plain", "folded"])
def test_per_sample_gradients_under_vmap_take_the_direct_calls(monkeypatch, which):
    """torch.func runs the training program: the direct runners under vmap(grad(...))."""
    from torch.func import functional_call, grad, vmap

    net, out, shape = (
        (_net(), "prob", (3, 12, 12)) if which == "plain" else (_folded_net(), "d", (3, 8, 8))
    )
    params = {k: v.detach() for k, v in net.named_parameters()}
    xs = torch.randn(4, *shape)

    def loss(p, x):
        return functional_call(net, p, (), {"data": x[None]})[out].sum()

    net.optimize = False
    want = vmap(grad(loss), in_dims=(None, 0))(params, xs)
    net.optimize = True
    off_cpu_programs(monkeypatch, net)
    got = vmap(grad(loss), in_dims=(None, 0))(params, xs)
    assert any(k.endswith("+direct") for k in net.training_program().runners)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-5)
