"""ELU: max(x, 0) + alpha * (exp(min(x, 0)) - 1); Caffe's gradient at 0 is alpha + y = alpha."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer

CASES = [
    LayerCase("ELU", id="elu_default"),
    LayerCase("ELU", "elu_param { alpha: 0.4 }", ((4, 3, 5),), id="elu_alpha"),
]


@pytest.mark.parametrize("alpha", [1.0, 0.4, 2.5])
def test_forward_backward_match_caffe_with_zeros(alpha):
    alpha = float(np.float32(alpha))
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 4, 5)) * 2
    x.flat[::6] = 0.0
    top_diff = rng.standard_normal(x.shape)
    layer, _ = make_layer(
        f"elu_param {{ alpha: {alpha} }}", [x.shape], type="ELU", dtype=torch.float64
    )
    xt = torch.tensor(x, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff))
    want = np.maximum(x, 0) + alpha * (np.exp(np.minimum(x, 0)) - 1)
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-12, atol=1e-15)
    caffe_diff = top_diff * ((x > 0) + (alpha + want) * (x <= 0))  # ELULayer::Backward_cpu
    np.testing.assert_allclose(xt.grad.numpy(), caffe_diff, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, kink=0.0, kink_range=0.01)
