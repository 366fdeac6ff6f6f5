"""HardSigmoid (brocolli-caffe): max(0, min(1, alpha * x + beta)); forward only in the fork."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer

CASES = [
    LayerCase("HardSigmoid", id="hardsigmoid_default"),
    LayerCase(
        "HardSigmoid",
        "hardsigmoid_param { alpha: 0.3 beta: 0.4 }",
        ((4, 3, 5),),
        id="hardsigmoid_alpha_beta",
    ),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha,beta", [(0.2, 0.5), (0.3, 0.4), (-1.5, 0.25), (1 / 6, 0.5)])
def test_forward_matches_fork(alpha, beta, dtype):
    alpha, beta = float(np.float32(alpha)), float(np.float32(beta))
    rng = np.random.default_rng(14)
    x = torch.tensor(rng.standard_normal((2, 3, 4, 5)) * 4, dtype=dtype)
    layer, _ = make_layer(
        f"hardsigmoid_param {{ alpha: {alpha} beta: {beta} }}",
        [x.shape],
        type="HardSigmoid",
        dtype=dtype,
    )
    xn = x.double().numpy()
    want = np.maximum(0, np.minimum(1, xn * alpha + beta))
    rtol = 1e-12 if dtype == torch.float64 else 1e-6
    np.testing.assert_allclose(layer(x).double().numpy(), want, rtol=rtol, atol=1e-7)


def test_no_backward():
    layer, (x,) = make_layer("", type="HardSigmoid")
    assert layer.has_backward is False
    assert not layer(x.requires_grad_(True)).requires_grad
