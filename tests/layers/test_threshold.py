"""Threshold: 1 where x > threshold (strictly), else 0; forward only in Caffe."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer

CASES = [
    LayerCase("Threshold", id="threshold_default"),
    LayerCase("Threshold", "threshold_param { threshold: 0.2 }", ((3, 5, 4),), id="threshold_02"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threshold", [0.0, 0.2, -1.3])
def test_forward_is_strict(threshold, dtype):
    t = np.float32(threshold)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    x.flat[::4] = t  # exactly at the threshold: 0
    layer, _ = make_layer(
        f"threshold_param {{ threshold: {threshold} }}", [x.shape], type="Threshold", dtype=dtype
    )
    y = layer(torch.from_numpy(x).to(dtype))
    assert y.dtype == dtype
    np.testing.assert_array_equal(y.double().numpy(), (x > t).astype(np.float64))


def test_no_backward():
    layer, (x,) = make_layer("", type="Threshold")
    assert layer.has_backward is False
    assert not layer(x.requires_grad_(True)).requires_grad
