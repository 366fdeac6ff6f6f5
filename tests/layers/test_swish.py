"""Swish: x * sigmoid(beta x), gradient beta y + sigmoid(beta x) (1 - beta y) as Caffe."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer

CASES = [
    LayerCase("Swish", id="swish_default"),
    LayerCase("Swish", "swish_param { beta: 1.7 }", ((4, 3, 5),), id="swish_beta"),
    LayerCase("Swish", "swish_param { beta: -0.6 }", id="swish_negative_beta"),
]


@pytest.mark.parametrize("beta", [1.0, 1.7, -0.6, 0.0])
def test_forward_backward_match_caffe(beta):
    beta = float(np.float32(beta))
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 3, 4, 5)) * 3
    top_diff = rng.standard_normal(x.shape)
    layer, _ = make_layer(
        f"swish_param {{ beta: {beta} }}", [x.shape], type="Swish", dtype=torch.float64
    )
    xt = torch.tensor(x, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff))
    s = 0.5 * np.tanh(0.5 * beta * x) + 0.5
    want = x * s
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-12, atol=1e-15)
    caffe_diff = top_diff * (beta * want + s * (1 - beta * want))  # SwishLayer::Backward_cpu
    np.testing.assert_allclose(xt.grad.numpy(), caffe_diff, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)
