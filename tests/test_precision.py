"""caffe_float32: Caffe's IEEE float32 on CUDA, scoped to the nets' own entry points.

torch runs cuDNN float32 convolutions in TF32 by default on Ampere and later (an H200's
profile showed the TF32 kernels). The switches are process-wide, so the tests read
them from inside a layer's forward (a hook) and check that the caller's settings return.
Without a GPU the nets are told they compute on CUDA (``on_cuda`` patched)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from google.protobuf import text_format

import torchcaffe
import torchcaffe.net.net as net_module
import torchcaffe.pycaffe.net as pycaffe_net
from torchcaffe import precision
from torchcaffe.proto import caffe_pb2

NET = """
name: "p"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
layer { name: "t" type: "Input" top: "target" input_param { shape { dim: 2 dim: 2 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
"""


def _switches() -> list:
    return [getattr(owner, name) for owner, name, _ in precision._settings()]


def _ieee() -> list:
    return [ieee for _, _, ieee in precision._settings()]


@pytest.fixture
def tf32_on():
    """The caller's own settings: TF32 allowed for both (restored after the test)."""
    settings = precision._settings()
    saved = _switches()
    tf32 = "tf32" if isinstance(saved[0], str) else True
    for owner, name, _ in settings:
        setattr(owner, name, tf32)
    yield _switches()
    for (owner, name, _), value in zip(settings, saved):
        setattr(owner, name, value)


def test_the_context_sets_ieee_and_restores_the_callers_settings(tf32_on):
    with precision.caffe_float32():
        assert _switches() == _ieee()
    assert _switches() == tf32_on
    with pytest.raises(RuntimeError), precision.caffe_float32():
        raise RuntimeError("a failing layer")
    assert _switches() == tf32_on
    with precision.caffe_float32(enabled=False):
        assert _switches() == tf32_on


def _seen_during_conv(net: torchcaffe.TorchNet) -> list:
    seen: list = []
    net.layers["conv"].register_forward_pre_hook(lambda *_: seen.append(_switches()))
    return seen


def test_torch_face_forward_on_cuda_runs_in_ieee(tf32_on, monkeypatch):
    net = torchcaffe.load(text_format.Parse(NET, caffe_pb2.NetParameter()), phase="test")
    seen = _seen_during_conv(net)
    x = torch.randn(2, 3, 6, 6)
    net(data=x, target=torch.zeros(2, 2))
    assert seen == [tf32_on]  # on the CPU nothing is touched
    monkeypatch.setattr(net_module, "on_cuda", lambda device: device is not None)
    net(data=x, target=torch.zeros(2, 2))
    assert seen[1] == _ieee() and _switches() == tf32_on


def test_torch_face_backward_on_cuda_runs_in_ieee(tf32_on, monkeypatch):
    # loss.backward() runs after forward returned: the outputs' gradient hooks enter IEEE and
    # the engine's end-of-pass callback leaves it, once per backward pass
    net = torchcaffe.load(text_format.Parse(NET, caffe_pb2.NetParameter()), phase="train")
    monkeypatch.setattr(net_module, "on_cuda", lambda device: device is not None)
    in_backward: list = []
    net.layers["conv"].weight.register_hook(lambda g: in_backward.append(_switches()))
    x = torch.randn(2, 3, 6, 6)
    out = net(data=x, target=torch.zeros(2, 2))
    assert _switches() == tf32_on
    out["loss"].backward(retain_graph=True)
    assert _switches() == tf32_on
    out["loss"].backward()
    assert in_backward == [_ieee(), _ieee()] and _switches() == tf32_on
    assert precision._depth == 0
    with torch.no_grad():  # nothing to hook
        assert not net(data=x, target=torch.zeros(2, 2))["loss"].requires_grad


def test_caffe_face_forward_backward_and_solver_step_run_in_ieee(tf32_on, monkeypatch, tmp_path):
    (tmp_path / "net.prototxt").write_text(NET)
    monkeypatch.setattr(pycaffe_net, "on_cuda", lambda device: True)
    net = torchcaffe.Net(str(tmp_path / "net.prototxt"), torchcaffe.TRAIN)
    seen = _seen_during_conv(net.module)
    grads: list = []
    net.module.layers["conv"].weight.register_hook(lambda g: grads.append(_switches()))
    net.blobs["data"].data[...] = np.random.default_rng(0).standard_normal((2, 3, 6, 6))
    net.forward()
    net.backward()
    net.forward_backward()
    assert seen == [_ieee(), _ieee()] and grads == [_ieee(), _ieee()]
    assert _switches() == tf32_on


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 needs a CUDA GPU")
def test_cuda_convolution_matches_the_cpu_with_tf32_allowed(tf32_on):
    # 64 -> 64 channels, 3x3, unit weights: tops of ~24, where TF32's 10-bit products would
    # be ~1e-2 off and IEEE float32's ~1e-5
    text = NET.replace("num_output: 4", "num_output: 64").replace("dim: 3 dim: 6", "dim: 64 dim: 6")
    text = text.replace('type: "gaussian" }', 'type: "gaussian" std: 1 }', 1)
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="test")
    x = torch.randn(2, 64, 6, 6)
    with torch.no_grad():
        want = net.forward_all_blobs(data=x, target=torch.zeros(2, 2))["conv"]
        net.cuda()
        got = net.forward_all_blobs(data=x.cuda(), target=torch.zeros(2, 2).cuda())["conv"]
    assert want.abs().max() > 10
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    assert _switches() == tf32_on


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 needs a CUDA GPU")
def test_cuda_torch_face_backward_matches_the_cpu_with_tf32_allowed(tf32_on):
    # the convolution's weight gradient sums 2 x 4 x 4 products of unit-scale inputs and top
    # gradients: TF32's 10-bit products put every element ~5e-4 relative off. IEEE float32
    # is not bit-equal to the CPU either (cuDNN picks FFT or Winograd algorithms for some
    # shapes: an H100 put 6 of 2304 elements 5e-4 off), so the median is compared, and the
    # switches are read in the middle of the backward.
    text = NET.replace("dim: 3 dim: 6", "dim: 64 dim: 6")
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="train")
    x, t = torch.randn(2, 64, 6, 6), torch.randn(2, 2)
    grads, seen = [], []
    for device in ("cpu", "cuda"):
        net.to(device).zero_grad()
        blobs = net.forward_all_blobs(data=x.to(device), target=t.to(device))
        blobs["conv"].register_hook(lambda grad: seen.append(_switches()))
        blobs["loss"].backward()
        # a copy: moving the net to CUDA moves a param's grad tensor with it, in place
        grads.append(net.layers["conv"].weight.grad.to("cpu", copy=True))
    assert seen[1] == _ieee()
    relative = (grads[1] - grads[0]).abs() / grads[0].abs().clamp_min(1e-6)
    assert relative.median() < 5e-5  # TF32: ~5e-4
    assert _switches() == tf32_on


def test_overlapping_threads_leave_the_callers_settings(tf32_on):
    # thread A enters, B enters, A leaves, B leaves: B computes in IEEE until it leaves, and
    # the settings found before A entered come back (not the IEEE ones B found)
    import threading

    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def a():
        with precision.caffe_float32():
            a_in.set()
            b_in.wait()
        a_out.set()

    def b():
        a_in.wait()
        with precision.caffe_float32():
            b_in.set()
            a_out.wait()
            seen.append(_switches())

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [_ieee()]
    assert _switches() == tf32_on
