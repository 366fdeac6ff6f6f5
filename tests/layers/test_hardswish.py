"""HardSwish (brocolli-caffe): x * max(0, min(1, x / 6 + 0.5)); forward only in the fork."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer

CASES = [
    LayerCase("HardSwish", id="hardswish_default"),
    LayerCase("HardSwish", bottom_shapes=((3, 5, 2),), id="hardswish_3d"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_matches_fork(dtype):
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 3, 4, 5)) * 4
    x.flat[:5] = [-3.0, 3.0, 0.0, -6.0, 6.0]
    x = torch.tensor(x, dtype=dtype)
    layer, _ = make_layer("", [x.shape], type="HardSwish", dtype=dtype)
    xn = x.double().numpy()
    want = xn * np.maximum(0, np.minimum(1, xn / 6 + 0.5))
    rtol = 1e-12 if dtype == torch.float64 else 1e-6
    np.testing.assert_allclose(layer(x).double().numpy(), want, rtol=rtol, atol=1e-30)


def test_no_backward():
    layer, (x,) = make_layer("", type="HardSwish")
    assert layer.has_backward is False
    assert not layer(x.requires_grad_(True)).requires_grad
