"""TanH: tanh(x), gradient 1 - y^2."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer

CASES = [
    LayerCase("TanH", id="tanh_default"),
    LayerCase("TanH", "tanh_param { engine: CAFFE }", ((5, 4),), id="tanh_2d"),
]


def test_forward_backward_match_caffe():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 4, 5)) * 3
    top_diff = rng.standard_normal(x.shape)
    layer, _ = make_layer("", [x.shape], type="TanH", dtype=torch.float64)
    xt = torch.tensor(x, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff))
    want = (np.exp(2 * x) - 1) / (np.exp(2 * x) + 1)
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(xt.grad.numpy(), top_diff * (1 - want**2), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)
