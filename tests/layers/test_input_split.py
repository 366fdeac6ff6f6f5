"""Input (declared shapes) and Split (fan-out whose backward sums the top diffs)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Input", "input_param { shape { dim: 2 dim: 3 } }", (), id="input_one_shape"),
    LayerCase(
        "Input",
        'input_param { shape { dim: 2 } shape { dim: 4 dim: 5 } } top: "a" top: "b"',
        (),
        n_tops=2,
        id="input_two_shapes",
    ),
    LayerCase("Split", "", ((2, 3, 4),), n_tops=3, id="split_3"),
]


def test_input_shapes_one_for_all_tops_or_one_per_top():
    layer, _ = make_layer(
        'input_param { shape { dim: 2 dim: 3 } } top: "a" top: "b"', (), type="Input", n_tops=2
    )
    assert layer.output_shapes([]) == [(2, 3), (2, 3)]
    layer, _ = make_layer(
        'input_param { shape { dim: 2 } shape { dim: 4 dim: 5 } } top: "a" top: "b"',
        (),
        type="Input",
        n_tops=2,
    )
    assert layer.output_shapes([]) == [(2,), (4, 5)]


def test_input_wrong_number_of_shapes():
    with pytest.raises(LayerParamError, match=r"\(Input\).*shapes"):
        make_layer(
            'input_param { shape { dim: 2 } shape { dim: 3 } shape { dim: 4 } } top: "a" top: "b"',
            (),
            type="Input",
            n_tops=2,
        )


def test_input_negative_dim():
    with pytest.raises(LayerParamError, match=r"\(Input\).*negative"):
        make_layer("input_param { shape { dim: 2 dim: -1 } }", (), type="Input")


def test_split_copies_and_sums_diffs():
    layer, (x,) = make_layer("", [(2, 3)], type="Split", n_tops=3)
    x.requires_grad_(True)
    tops = layer(x)
    assert all(torch.equal(t, x) for t in tops)
    sum(t * (i + 1) for i, t in enumerate(tops)).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2, 3), 6.0))


def test_split_gradient():
    layer, (x,) = make_layer("", [(2, 3, 4)], type="Split", n_tops=2, dtype=torch.float64)
    check_layer_gradient(layer, [x])
