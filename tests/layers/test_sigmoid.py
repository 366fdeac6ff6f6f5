"""Sigmoid: Caffe's 0.5 * tanh(0.5 x) + 0.5 (in double), gradient y * (1 - y)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer

CASES = [
    LayerCase("Sigmoid", id="sigmoid_default"),
    LayerCase("Sigmoid", "sigmoid_param { engine: CAFFE }", ((4, 3, 5),), id="sigmoid_3d"),
]


def ref_sigmoid(x):
    return 0.5 * np.tanh(0.5 * x) + 0.5


def test_forward_backward_match_caffe():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 5)) * 4
    top_diff = rng.standard_normal(x.shape)
    layer, _ = make_layer("", [x.shape], type="Sigmoid", dtype=torch.float64)
    xt = torch.tensor(x, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff))
    want = ref_sigmoid(x)
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(xt.grad.numpy(), top_diff * want * (1 - want), rtol=1e-9, atol=1e-15)


def test_forward_float32_saturates_like_caffe():
    """Caffe rounds a double result to float: tiny or 1 at the extremes, never NaN."""
    x = np.array([-200.0, -40.0, -17.0, 0.0, 17.0, 40.0, 200.0], dtype=np.float32)
    layer, _ = make_layer("", [x.shape], type="Sigmoid")
    y = layer(torch.from_numpy(x)).numpy()
    want = ref_sigmoid(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)
