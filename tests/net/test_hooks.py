"""torch hooks on a net's layers run as in any torch model: a net whose layers carry hooks
runs them as modules instead of the passes' merged steps (torchcaffe/ops/hook_watch.py)."""

from __future__ import annotations

import copy

import numpy as np
import torch
from google.protobuf import text_format
from torch.nn.modules import module as torch_module

import torchcaffe
from torchcaffe.proto import caffe_pb2

from ..helpers.params import fill_params

# every layer after the input is merged by a pass: conv + bn + scale + relu folded and fused,
# ip + relu fused
NET = """
input: "data" input_shape { dim: 2 dim: 3 dim: 8 dim: 8 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "ip" type: "InnerProduct" bottom: "c" top: "f" inner_product_param { num_output: 5 } }
layer { name: "relu2" type: "ReLU" bottom: "f" top: "f" }
"""


def _net(phase: str = "test") -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(NET, caffe_pb2.NetParameter()), phase=phase)
    fill_params(net, lambda t, gen: torch.rand(t.shape, generator=gen) + 0.1, seed=2)
    return net


def _literal(net: torchcaffe.TorchNet, x: torch.Tensor) -> torch.Tensor:
    net.optimize = False
    try:
        with torch.inference_mode():
            return net(data=x)["f"]
    finally:
        net.optimize = True


def test_a_forward_hook_on_a_folded_layer_runs_on_every_forward():
    net = _net()
    x = torch.rand(2, 3, 8, 8)
    with torch.inference_mode():
        net(data=x)  # the passes' program is built and cached first
    assert net.optimized_program().report["fold_batchnorm_scale_into_producer"] == 1
    want = _literal(net, x)
    seen: list[torch.Tensor] = []
    handle = net.layer("conv").register_forward_hook(lambda m, i, o: seen.append(o.clone()))
    with torch.inference_mode():
        got = net(data=x)["f"]
        net(data=x)
    assert len(seen) == 2
    conv = net.layer("conv")
    with torch.no_grad():
        want_conv = torch.nn.functional.conv2d(x, conv.weight, conv.bias)
    np.testing.assert_allclose(seen[0].numpy(), want_conv.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert net.layers_hooked()
    handle.remove()
    assert not net.layers_hooked()  # the passes run again
    with torch.inference_mode():
        net(data=x)
    assert len(seen) == 2


def test_pre_hooks_and_global_hooks_count_too():
    net = _net()
    x = torch.rand(2, 3, 8, 8)
    calls: list[str] = []
    handle = net.layer("relu2").register_forward_pre_hook(lambda m, i: calls.append("pre"))
    with torch.inference_mode():
        net(data=x)
    handle.remove()
    assert calls == ["pre"]
    handle = torch_module.register_module_forward_hook(
        lambda m, i, o: calls.append(type(m).__name__)
    )
    try:
        assert net.layers_hooked()
        with torch.inference_mode():
            net(data=x)
    finally:
        handle.remove()
    assert "BatchNormLayer" in calls and "ScaleLayer" in calls
    assert not net.layers_hooked()


def test_a_backward_hook_runs_in_a_recorded_forward():
    """The training passes fuse BatchNorm + Scale: a hook on the Scale's backward runs."""
    net = _net(phase="train")
    assert net.training_program().report  # the passes exist for such a forward
    grads: list[torch.Tensor] = []
    net.layer("sc").register_full_backward_hook(lambda m, gi, go: grads.append(go[0]))
    x = torch.rand(2, 3, 8, 8, requires_grad=True)
    net(data=x)["f"].sum().backward()
    assert len(grads) == 1 and grads[0].shape == (2, 4, 6, 6)


def caffe_face_after_a_forward(tmp_path) -> torchcaffe.Net:
    """NET's Caffe face (written under ``tmp_path``), fed and run once: its programs made."""
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET)
    net = torchcaffe.Net(str(proto), torchcaffe.TEST)
    net.blobs["data"].data[...] = np.random.default_rng(0).random((2, 3, 8, 8))
    net.forward()
    return net


def test_the_caffe_face_runs_hooked_layers_too(tmp_path):
    net = caffe_face_after_a_forward(tmp_path)
    calls: list[tuple[int, ...]] = []
    handle = net.module.layer("bn").register_forward_hook(lambda m, i, o: calls.append(o.shape))
    net.forward()
    handle.remove()
    net.forward()
    assert calls == [(2, 4, 6, 6)]


def test_a_forward_given_to_a_folded_layer_runs_on_every_forward():
    """``layer.forward = wrapped`` after the program was made: the net runs its layers as
    modules while the instance has it (a fold would skip the BatchNorm), and the passes again
    once it is deleted."""
    net = _net()
    x = torch.rand(2, 3, 8, 8)
    with torch.inference_mode():
        net(data=x)
    want = _literal(net, x)
    bn = net.layer("bn")
    built = bn.forward
    calls: list[tuple[int, ...]] = []

    def probe(t: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(t.shape))
        return built(t)

    bn.forward = probe
    assert net.layers_hooked()
    with torch.inference_mode():
        got = net(data=x)["f"]
        net(data=x)
    assert calls == [(2, 4, 6, 6)] * 2
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    del bn.forward
    assert not net.layers_hooked()
    with torch.inference_mode():
        net(data=x)
    assert len(calls) == 2


def test_a_forward_given_to_an_unmerged_layer_reaches_the_eager_walk():
    """The eager walk calls a layer's bound ``forward`` (passes/program.py): one given to
    the instance later is the one that runs, the program made before it notwithstanding."""
    net = torchcaffe.load(
        text_format.Parse(
            NET + 'layer { name: "prob" type: "Softmax" bottom: "f" top: "p" }',
            caffe_pb2.NetParameter(),
        ),
        phase="test",
    )
    x = torch.rand(2, 3, 8, 8)
    with torch.inference_mode():
        want = net(data=x)["p"]
    net.layer("prob").forward = lambda t: torch.zeros_like(t)
    with torch.inference_mode():
        assert not net(data=x)["p"].any()
    del net.layer("prob").forward
    with torch.inference_mode():
        torch.testing.assert_close(net(data=x)["p"], want)


def test_a_forward_a_layer_chose_when_built_is_no_hook():
    """An in-place ELU sets its instance's forward itself (its backward reads the top): its net
    runs the passes, and so does a deep copy of it."""
    text = NET + 'layer { name: "elu" type: "ELU" bottom: "f" top: "f" }'
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="test")
    assert "forward" in vars(net.layer("elu"))
    assert not net.layers_hooked()
    assert not copy.deepcopy(net).layers_hooked()


def test_the_caffe_face_runs_a_layer_given_a_forward(tmp_path):
    net = caffe_face_after_a_forward(tmp_path)
    scale = net.module.layer("sc")
    built = scale.forward
    calls: list[int] = []
    scale.forward = lambda t: calls.append(1) or built(t)
    net.forward()
    del scale.forward
    net.forward()
    assert calls == [1]
