"""ReLU: max(x, 0) + negative_slope * min(x, 0); Caffe's gradient at 0 is negative_slope."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer

CASES = [
    LayerCase("ReLU", id="relu_default"),
    LayerCase("ReLU", "relu_param { negative_slope: 0.1 }", ((2, 3, 4, 5),), id="relu_leaky"),
    LayerCase(
        "ReLU",
        "relu_param { negative_slope: -0.5 engine: CUDNN }",
        ((3, 4, 5),),
        id="relu_negative_slope_cudnn",
    ),
]


def ref_relu(x, slope):
    return np.maximum(x, 0) + slope * np.minimum(x, 0)


def ref_relu_diff(x, top_diff, slope):
    """Caffe's ReLULayer::Backward_cpu: (x > 0) + slope * (x <= 0)."""
    return top_diff * ((x > 0) + slope * (x <= 0))


def _forward_backward(snippet, x, top_diff):
    layer, _ = make_layer(snippet, [x.shape], type="ReLU", dtype=torch.float64)
    xt = torch.tensor(x, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff))
    return y.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("slope", [0.0, 0.1, -0.5, 2.0])
def test_forward_backward_match_caffe_with_zeros(slope):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5))
    x.flat[::7] = 0.0  # Caffe's gradient at exactly 0 is negative_slope
    top_diff = rng.standard_normal(x.shape)
    y, dx = _forward_backward(f"relu_param {{ negative_slope: {slope} }}", x, top_diff)
    np.testing.assert_allclose(y, ref_relu(x, np.float32(slope)), rtol=1e-12)
    np.testing.assert_allclose(dx, ref_relu_diff(x, top_diff, np.float32(slope)), rtol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, kink=0.0, kink_range=0.01)
