"""inner_product_on_onednn: large InnerProducts run on oneDNN's matmul, with Caffe's outputs.

Tolerances are the golden ones (rtol 1e-4, atol 1e-5): only the order of each dot product's
additions changes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from google.protobuf import text_format

import torchcaffe
import torchcaffe as caffe
from torchcaffe.net.passes import onednn
from torchcaffe.proto import caffe_pb2

from ..helpers.params import fill_params

PASS = "inner_product_on_onednn"
RTOL, ATOL = 1e-4, 1e-5

pytestmark = pytest.mark.skipif(
    not onednn.available(), reason="this torch build has no oneDNN linear op"
)

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


def _net() -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(NET, caffe_pb2.NetParameter()), phase="test")
    fill_params(net, lambda t, gen: torch.rand(t.shape, generator=gen) - 0.5, 0)
    return net


def _unoptimized(net, x):
    net.optimize = False
    try:
        with torch.no_grad():
            return net.forward_all_blobs(data=x)
    finally:
        net.optimize = True


@pytest.fixture
def calls(monkeypatch):
    """How many times oneDNN's linear op ran."""
    count = [0]
    real = onednn._LINEAR

    def counted(*args):
        count[0] += 1
        return real(*args)

    monkeypatch.setattr(onednn, "_LINEAR", counted)
    return count


def test_fires_on_inner_products_with_large_weights_only():
    program = _net().optimized_program()
    assert program.report[PASS] == 2  # big (512x512) and tr (512x520); not small nor ax2
    keys = {s.name: s.key for s in program.steps}
    assert keys["big"].startswith("big+onednn") and keys["tr"].startswith("tr+onednn")
    assert "onednn" not in keys["small"] and "onednn" not in keys["ax2"]


@pytest.mark.parametrize("batch", [1, 3])
def test_outputs_equal_the_unoptimized_net(batch, calls, monkeypatch):
    monkeypatch.setattr(onednn, "MIN_WEIGHTS", 0)  # every InnerProduct, axis 2 too
    net = _net()
    assert net.optimized_program(net.blob_names).report[PASS] == 4
    x = torch.randn(batch, 8, 8, 8)
    want = _unoptimized(net, x)
    with torch.inference_mode():
        got = net.forward_all_blobs(data=x)
    assert calls[0] == 4
    for name in ("big", "tr", "small", "ax2"):
        assert got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), rtol=RTOL, atol=ATOL)


def test_the_caffe_face_forward_runs_it(calls, tmp_path):
    path = tmp_path / "fc.prototxt"
    path.write_text(NET)
    net = caffe.Net(str(path), caffe.TEST)
    gen = np.random.default_rng(0)
    for blobs in net.params.values():
        for blob in blobs:
            blob.data[...] = gen.random(blob.data.shape) - 0.5
    x = gen.standard_normal((3, 8, 8, 8)).astype(np.float32)
    net.blobs["data"].data[...] = x
    got = net.forward()["small"]
    assert calls[0] == 2
    (w1, b1), (w2,), (w3, b3) = (
        [b.data.astype(np.float64) for b in net.params[n]] for n in ("big", "tr", "small")
    )
    big = np.maximum(x.reshape(3, -1) @ w1.T + b1, 0)
    want = (big @ w2) @ w3.T + b3  # tr: transpose, (K, N) weight
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_params_are_read_on_every_call(calls):
    """No copy of the weight is kept: a changed param shows in the next forward."""
    net = _net()
    x = torch.randn(1, 8, 8, 8)
    with torch.inference_mode():
        before = net(data=x)["small"]
    with torch.no_grad():
        net.layers["big"].weight.mul_(2)
    with torch.inference_mode():
        after = net(data=x)["small"]
    np.testing.assert_allclose(after.numpy(), _unoptimized(net, x)["small"].numpy(), RTOL, ATOL)
    assert not torch.allclose(before, after)


@pytest.mark.filterwarnings("ignore:TF32")  # mkldnn.flags() sets it too
def test_calls_onednn_cannot_take_run_f_linear(calls):
    w, b = torch.randn(600, 500), torch.randn(600)
    x = torch.randn(2, 500)
    with torch.no_grad():  # float64
        got = onednn.linear(x.double(), w.double(), b.double())
        assert torch.equal(got, torch.nn.functional.linear(x.double(), w.double(), b.double()))
    with torch.backends.mkldnn.flags(enabled=False), torch.no_grad():
        assert torch.equal(onednn.linear(x, w, b), torch.nn.functional.linear(x, w, b))
    xg = x.clone().requires_grad_(True)  # autograd recording: F.linear, which has a backward
    onednn.linear(xg, w, b).sum().backward()
    assert xg.grad is not None
    with torch.no_grad():  # below MIN_WEIGHTS
        small = torch.randn(10, 500)
        assert torch.equal(onednn.linear(x, small, None), torch.nn.functional.linear(x, small))
    assert calls[0] == 0
    with torch.no_grad():
        onednn.linear(x, w, b)
    assert calls[0] == 1


def test_training_program_leaves_inner_products_alone():
    net = _net()
    assert PASS not in net.training_program().report
    x = torch.randn(2, 8, 8, 8)
    net(data=x)["small"].sum().backward()  # autograd path: F.linear's backward
    assert net.layers["big"].weight.grad is not None
