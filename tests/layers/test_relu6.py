"""ReLU6 (brocolli-caffe): min(max(x, 0) + negative_slope * min(x, 0), threshold); the fork's
gradient is (x > 0 ? 1 : negative_slope) masked by x < threshold (strict, tested on x)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer


def _spread(shape):
    return lambda g: [torch.randn(shape, generator=g, dtype=torch.float64) * 4]


CASES = [
    LayerCase("ReLU6", make_bottoms=_spread((2, 3, 4, 5)), id="relu6_default"),
    LayerCase(
        "ReLU6",
        "relu6_param { negative_slope: 0.1 threshold: 4 }",
        ((2, 4, 3),),
        make_bottoms=_spread((2, 4, 3)),
        id="relu6_slope_threshold",
    ),
    LayerCase(
        "ReLU6",
        "relu6_param { negative_slope: -2 threshold: 3 }",
        make_bottoms=_spread((2, 3, 4, 5)),
        id="relu6_negative_slope",
    ),
]


def ref_relu6(x, slope, threshold):
    return np.minimum(np.maximum(x, 0) + slope * np.minimum(x, 0), threshold)


def ref_relu6_diff(x, top_diff, slope, threshold):
    """The fork's ReLU6Layer::Backward_cpu."""
    return top_diff * ((x > 0) + slope * (x <= 0)) * (x < threshold)


@pytest.mark.parametrize(
    "slope,threshold", [(0, 6), (0.1, 4), (-2, 3), (0.1, -1), (3, -1), (0, 0), (0, -2)]
)
def test_forward_backward_match_fork_at_kinks(slope, threshold):
    slope, threshold = float(np.float32(slope)), float(np.float32(threshold))
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 3, 4, 5)) * 4
    x.flat[::6], x.flat[1::6] = 0.0, threshold  # the kinks themselves
    top_diff = rng.standard_normal(x.shape)
    layer, _ = make_layer(
        f"relu6_param {{ negative_slope: {slope} threshold: {threshold} }}",
        [x.shape],
        type="ReLU6",
        dtype=torch.float64,
    )
    xt = torch.tensor(x, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff))
    np.testing.assert_array_equal(y.detach().numpy(), ref_relu6(x, slope, threshold))
    np.testing.assert_array_equal(xt.grad.numpy(), ref_relu6_diff(x, top_diff, slope, threshold))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, (x,) = case.build()
    for kink in (0.0, layer.threshold):  # keep central differences off the kinks
        x = torch.where((x - kink).abs() < 0.02, x + 0.05, x)
    if layer.negative_slope < 0:  # where slope * x > threshold the fork's gradient is not
        x = x.clamp(min=layer.threshold / layer.negative_slope + 0.05)  # the calculus one
    check_layer_gradient(layer, [x])
