"""onednn_linear: a large InnerProduct's product runs on oneDNN's matmul, with Caffe's values.

The reference is the same net with ``torch.backends.mkldnn`` off (``F.linear``). Tolerances
are the golden ones (rtol 1e-4, atol 1e-5): only the order of each dot product's additions
changes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from google.protobuf import text_format

import torchcaffe
import torchcaffe as caffe
from torchcaffe.ops import onednn_linear
from torchcaffe.proto import caffe_pb2

from ..helpers.counting import count_calls
from ..helpers.params import fill_params

RTOL, ATOL = 1e-4, 1e-5

pytestmark = [
    pytest.mark.skipif(
        not onednn_linear.available(), reason="this torch build has no oneDNN linear op"
    ),
    pytest.mark.filterwarnings("ignore:TF32"),  # mkldnn.flags() sets oneDNN's TF32 flag too
]

NET = """
name: "fc"
input: "data" input_shape { dim: 3 dim: 8 dim: 8 dim: 8 }
layer { name: "big" type: "InnerProduct" bottom: "data" top: "big"
  inner_product_param { num_output: 512 } }
layer { name: "relu" type: "ReLU" bottom: "big" top: "big" }
layer { name: "tr" type: "InnerProduct" bottom: "big" top: "tr"
  inner_product_param { num_output: 520 transpose: true bias_term: false } }
layer { name: "small" type: "InnerProduct" bottom: "tr" top: "small"
  inner_product_param { num_output: 10 } }
layer { name: "ax2" type: "InnerProduct" bottom: "data" top: "ax2"
  inner_product_param { num_output: 7 axis: 2 } }
"""


def _net(scale: float = 1.0) -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(NET, caffe_pb2.NetParameter()), phase="test")
    fill_params(net, lambda t, gen: (torch.rand(t.shape, generator=gen) - 0.5) * scale, 0)
    return net


def _blobs(net, x):
    with torch.inference_mode():
        return net.forward_all_blobs(data=x)


def _reference(net, x):
    """The same forward on F.linear."""
    with torch.backends.mkldnn.flags(enabled=False):
        return _blobs(net, x)


@pytest.fixture
def calls(monkeypatch):
    """How many times oneDNN's linear op ran."""
    return count_calls(monkeypatch, onednn_linear, "_LINEAR")


def test_runs_for_inner_products_with_large_weights_only(calls, monkeypatch):
    net = _net()
    x = torch.randn(2, 8, 8, 8)
    _blobs(net, x)
    assert calls[0] == 2  # big (512x512) and tr (512x520); not small nor ax2
    monkeypatch.setattr(onednn_linear, "MIN_WEIGHTS", 0)
    _blobs(net, x)
    assert calls[0] == 2 + 4


@pytest.mark.parametrize("batch", [1, 3])
def test_outputs_equal_f_linears(batch, calls, monkeypatch):
    monkeypatch.setattr(onednn_linear, "MIN_WEIGHTS", 0)  # every InnerProduct, axis 2 too
    # weights of +-0.05 keep every blob O(1), the scale the golden atol is meant for: at +-0.5
    # "tr" reaches ~40, and on a Xeon one output near zero rounded 1.5e-5 apart
    net = _net(scale=0.1)
    x = torch.randn(batch, 8, 8, 8)
    got, want = _blobs(net, x), _reference(net, x)
    assert calls[0] == 4
    for name in ("big", "tr", "small", "ax2"):
        assert got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), rtol=RTOL, atol=ATOL)


def test_the_caffe_face_forward_and_backward_run_it(calls, tmp_path):
    path = tmp_path / "fc.prototxt"
    path.write_text("force_backward: true\n" + NET)  # no loss: Caffe would skip backward
    nets = [caffe.Net(str(path), caffe.TEST) for _ in range(2)]
    gen = np.random.default_rng(0)
    x = gen.standard_normal((3, 8, 8, 8)).astype(np.float32)
    for blobs in zip(*(net.params.values() for net in nets)):
        for pair in zip(*blobs):
            value = gen.random(pair[0].data.shape) * 0.1 - 0.05
            for blob in pair:
                blob.data[...] = value
    runs = []
    for net, onednn in zip(nets, (True, False)):
        with torch.backends.mkldnn.flags(enabled=onednn):
            net.blobs["data"].data[...] = x
            out = net.forward()["small"].copy()
            if onednn:
                assert calls[0] == 2  # big, tr
            net.blobs["small"].diff[...] = 1.0
            net.backward()
            if onednn:
                assert calls[0] > 2  # their backward too
        diffs = [b.diff.copy() for bs in net.params.values() for b in bs]
        runs.append([out, net.blobs["data"].diff.copy(), *diffs])
    assert np.abs(runs[0][1]).max() > 0
    (w1, b1), (w2,), (w3, b3) = (
        [b.data.astype(np.float64) for b in nets[0].params[n]] for n in ("big", "tr", "small")
    )
    big = np.maximum(x.reshape(3, -1) @ w1.T + b1, 0)
    np.testing.assert_allclose(runs[0][0], (big @ w2) @ w3.T + b3, rtol=RTOL, atol=ATOL)
    for got, want in zip(*runs):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_params_are_read_on_every_call():
    """No copy of the weight is kept: a changed param shows in the next forward."""
    net = _net()
    x = torch.randn(1, 8, 8, 8)
    before = _blobs(net, x)["small"]
    with torch.no_grad():
        net.layers["big"].weight.mul_(2)
    after = _blobs(net, x)["small"]
    np.testing.assert_allclose(after.numpy(), _reference(net, x)["small"].numpy(), RTOL, ATOL)
    assert not torch.allclose(before, after)


def test_calls_onednn_cannot_take_run_f_linear(calls):
    w, b = torch.randn(600, 500), torch.randn(600)
    x = torch.randn(2, 500)
    with torch.no_grad():  # float64
        got = onednn_linear.linear(x.double(), w.double(), b.double())
        assert torch.equal(got, torch.nn.functional.linear(x.double(), w.double(), b.double()))
    with torch.backends.mkldnn.flags(enabled=False), torch.no_grad():
        assert torch.equal(onednn_linear.linear(x, w, b), torch.nn.functional.linear(x, w, b))
    with torch.no_grad():  # below MIN_WEIGHTS
        small = torch.randn(10, 500)
        got = onednn_linear.linear(x, small, None)
        assert torch.equal(got, torch.nn.functional.linear(x, small))
    assert calls[0] == 0
    with torch.no_grad():
        onednn_linear.linear(x, w, b)
    assert calls[0] == 1


@pytest.mark.parametrize("batch", [1, 3])
def test_training_gradients_equal_f_linears(batch, calls):
    """Under autograd ``_OneDnnLinear`` runs: forward and the bottom's gradient on oneDNN (two
    calls per InnerProduct), the params' gradients as F.linear's backward has them."""
    # weights of Xavier's scale keep every blob near 1, so fp32 rounding stays at its own
    # relative size (with +-0.5 the gradients cancel from terms ~100x larger)
    net = _net(scale=0.1)
    x = torch.randn(batch, 8, 8, 8)
    grads = []
    for onednn in (True, False):
        net.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_()
        with torch.backends.mkldnn.flags(enabled=onednn):
            out = net.forward_all_blobs(data=xg)
            (out["small"] * torch.arange(10.0)).sum().backward()
        grads.append([xg.grad] + [p.grad for p in net.parameters() if p.grad is not None])
    assert calls[0] == 4  # big and tr: forward and bottom gradient each
    assert len(grads[0]) == len(grads[1]) > 1
    for got, want in zip(*grads):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL)


def test_a_gradient_nobody_needs_is_not_computed(calls):
    w = torch.randn(600, 500, requires_grad=True)
    x = torch.randn(2, 500)  # no gradient wanted for the bottom, nor a bias
    onednn_linear.linear(x, w, None).sum().backward()
    assert calls[0] == 1  # the forward only: no product for the bottom's gradient
    np.testing.assert_allclose(w.grad.numpy(), torch.ones(2, 600).t().mm(x).numpy(), 1e-5, 1e-5)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_jit_tracing_runs_f_linear(calls):
    """torch.jit's tracer (the TorchScript ONNX exporter) cannot record oneDNN's op."""
    net = _net()
    x = torch.randn(2, 8, 8, 8)
    with torch.no_grad():
        traced = torch.jit.trace(net, (x,), strict=False, check_trace=False)
        got = traced(x)["small"]
        np.testing.assert_allclose(got.numpy(), net(data=x)["small"].numpy(), RTOL, ATOL)
    assert calls[0] == 2  # the eager call after tracing, not the traced one
