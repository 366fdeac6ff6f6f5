"""PReLU: per-channel or shared slope, filler default 0.25, Caffe's x <= 0 backward, in-place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcaffe
from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError
from torchcaffe.formats.prototxt import read_net

CASES = [
    LayerCase(
        "PReLU", "prelu_param { filler { type: 'uniform' min: -1 max: 1 } }", id="prelu_channelwise"
    ),
    LayerCase(
        "PReLU", "prelu_param { channel_shared: true filler { value: -0.3 } }", id="prelu_shared"
    ),
    LayerCase("PReLU", "", ((5, 3),), id="prelu_2d"),
]


def ref_prelu(x, slope, shared):
    """Caffe's loops: channel c = (i / dim) % channels, slope index 0 when shared."""
    a = np.full(x.shape[1], slope) if shared else slope
    a = a.reshape((1, -1) + (1,) * (x.ndim - 2))
    return np.maximum(x, 0) + a * np.minimum(x, 0)


def ref_prelu_diff(x, slope, shared, top_diff):
    """-> (bottom diff, slope diff): x > 0 passes the diff, x <= 0 (zero too) scales it."""
    a = np.full(x.shape[1], slope) if shared else slope
    a = a.reshape((1, -1) + (1,) * (x.ndim - 2))
    neg = x <= 0
    bottom = top_diff * ((x > 0) + a * neg)
    per_elem = top_diff * x * neg
    axes = tuple(i for i in range(x.ndim) if i != 1)
    slope_diff = per_elem.sum() if shared else per_elem.sum(axis=axes)
    return bottom, slope_diff


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3), (2, 3, 5)])
@pytest.mark.parametrize("shared", [False, True])
def test_forward_backward_match_caffe_with_zeros(shape, shared):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape)
    x.flat[::4] = 0.0
    snippet = "prelu_param { filler { type: 'uniform' min: -1 max: 1 } "
    snippet += "channel_shared: true }" if shared else "}"
    layer, _ = make_layer(snippet, [shape], type="PReLU", dtype=torch.float64)
    slope = layer.weight.detach().numpy().copy()
    xt = torch.tensor(x, requires_grad=True)
    top = layer(xt)
    np.testing.assert_allclose(top.detach().numpy(), ref_prelu(x, slope, shared), rtol=1e-12)
    top_diff = rng.standard_normal(shape)
    top.backward(torch.tensor(top_diff))
    want_bottom, want_slope = ref_prelu_diff(x, slope, shared, top_diff)
    np.testing.assert_allclose(xt.grad.numpy(), want_bottom, rtol=1e-12)
    np.testing.assert_allclose(layer.weight.grad.numpy(), want_slope, rtol=1e-10)


def test_default_filler_and_blob_shapes():
    layer, _ = make_layer("", [(2, 3, 4, 5)], type="PReLU")
    assert layer.param_blobs()[0].shape == (3,)
    assert torch.all(layer.weight == 0.25)
    shared, _ = make_layer("prelu_param { channel_shared: true }", [(2, 3, 4, 5)], type="PReLU")
    assert shared.param_blobs()[0].shape == ()
    assert float(shared.weight.detach()) == 0.25


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, kink=0.0, kink_range=0.02)


def test_in_place_net_keeps_caffe_gradients():
    text = """
    layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 4 } } }
    layer { name: "p" type: "PReLU" bottom: "x" top: "x"
            prelu_param { filler { value: 0.1 } } }
    """
    net = torchcaffe.load(read_net(text), phase="train")
    x = torch.randn(2, 3, 4, dtype=torch.float32, requires_grad=True)
    y = net(x=x)["x"]
    np.testing.assert_allclose(
        y.detach().numpy(), np.where(x.detach() > 0, x.detach(), 0.1 * x.detach()), rtol=1e-6
    )
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.where(x.detach() > 0, 1.0, 0.1), rtol=1e-6)


@pytest.mark.parametrize("shape", [(6,), (2, 3, 4, 5, 6)])
def test_error_bottom_axes(shape):
    with pytest.raises(LayerParamError, match=r"layer 'p1' \(PReLU\).*2 to 4 axes"):
        make_layer("", [shape], type="PReLU", name="p1")


def test_error_channels_change():
    layer, _ = make_layer("", [(2, 3, 4)], type="PReLU", name="p1")
    with pytest.raises(LayerParamError, match=r"layer 'p1' \(PReLU\).*channels"):
        layer(torch.randn(2, 5, 4))
