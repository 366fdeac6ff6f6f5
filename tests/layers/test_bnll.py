"""BNLL: log(1 + exp(x)) in Caffe's stable form; backward exp(min(x, 50)) / (... + 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer

CASES = [
    LayerCase("BNLL", id="bnll_default"),
    LayerCase("BNLL", bottom_shapes=((3, 5, 2),), id="bnll_3d"),
]

KBNLL_THRESHOLD = 50.0


def ref_bnll(x):
    with np.errstate(over="ignore"):
        return np.where(x > 0, x + np.log(1 + np.exp(-np.abs(x))), np.log(1 + np.exp(-np.abs(x))))


def ref_bnll_diff(x, top_diff):
    e = np.exp(np.minimum(x, KBNLL_THRESHOLD))
    return top_diff * e / (e + 1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_forward_backward_match_caffe_including_extremes(dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 4, 5)) * 3
    x.flat[:10] = [0.0, 21.0, 30.0, 49.0, 50.0, 51.0, 90.0, 200.0, -90.0, -200.0]
    if dtype == torch.float32:
        x = x.astype(np.float32).astype(np.float64)
    top_diff = rng.standard_normal(x.shape)
    layer, _ = make_layer("", [x.shape], type="BNLL", dtype=dtype)
    xt = torch.tensor(x, dtype=dtype, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff, dtype=dtype))
    rtol = 1e-12 if dtype == torch.float64 else 1e-6
    assert torch.isfinite(y).all() and torch.isfinite(xt.grad).all()
    np.testing.assert_allclose(y.detach().double().numpy(), ref_bnll(x), rtol=rtol, atol=1e-30)
    np.testing.assert_allclose(
        xt.grad.double().numpy(), ref_bnll_diff(x, top_diff), rtol=rtol, atol=1e-30
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)
