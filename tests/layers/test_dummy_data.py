"""DummyData: shapes (shape or legacy NCHW), fillers (constant once, others every forward)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase(
        "DummyData",
        'top: "a" top: "b" dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 4 } '
        'data_filler { type: "constant" value: 0.5 } }',
        bottom_shapes=(),
        n_tops=2,
    ),
    LayerCase(
        "DummyData",
        'top: "a" dummy_data_param { shape { dim: 3 dim: 4 } data_filler { type: "gaussian" } }',
        bottom_shapes=(),
        deterministic=False,
    ),
]


def dummy(param, n_tops=1):
    tops = " ".join(f'top: "t{i}"' for i in range(n_tops))
    snippet = f"{tops} dummy_data_param {{ {param} }}"
    return make_layer(snippet, (), type="DummyData", n_tops=n_tops)[0]


def test_legacy_dims_per_top_or_shared():
    layer = dummy("num: 2 channels: 3 channels: 1 height: 4 width: 5 width: 2", 2)
    a, b = layer()
    assert a.shape == (2, 3, 4, 5) and b.shape == (2, 1, 4, 2)
    assert not a.any() and not b.any()


@pytest.mark.parametrize("kind", ["uniform", "gaussian", "xavier", "msra", "positive_unitball"])
def test_random_fillers_refill_every_forward(kind):
    torch.manual_seed(0)
    layer = dummy(f'shape {{ dim: 3 dim: 4 }} data_filler {{ type: "{kind}" }}')
    first, second = layer().clone(), layer()
    assert first.shape == (3, 4) and not torch.equal(first, second)


def test_per_top_fillers():
    layer = dummy(
        'shape { dim: 2 } data_filler { type: "constant" value: 3 } '
        'data_filler { type: "uniform" min: 5 max: 6 }',
        2,
    )
    a, b = layer()
    np.testing.assert_array_equal(a.numpy(), [3, 3])
    assert ((b >= 5) & (b <= 6)).all()


@pytest.mark.parametrize(
    "param,n,match",
    [
        ("shape { dim: 2 } num: 1 channels: 1 height: 1 width: 1", 1, "both shape and legacy"),
        ("shape { dim: 2 } shape { dim: 3 }", 3, "shape once or once per top"),
        ("num: 1 channels: 1 height: 1", 1, "width once"),
        ("shape { dim: 2 } data_filler { } data_filler { } ", 3, "data_filler"),
    ],
)
def test_bad_params(param, n, match):
    with pytest.raises(LayerParamError, match=match):
        dummy(param, n)
