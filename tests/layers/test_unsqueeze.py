"""Unsqueeze (brocolli-caffe): a size-1 axis at dim (negative from the end); no backward."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Unsqueeze", "unsqueeze_param { dim: 1 }", ((2, 3, 4),), id="dim1"),
    LayerCase("Unsqueeze", "unsqueeze_param { dim: -1 }", ((2, 3),), id="neg"),
]


@pytest.mark.parametrize(
    "shape,dim,want",
    [
        ((2, 3, 4), 1, (2, 1, 3, 4)),
        ((2, 3), -1, (2, 3, 1)),
        ((2, 3), 0, (1, 2, 3)),
        ((2, 3), 2, (2, 3, 1)),
        ((2, 3), -3, (1, 2, 3)),
        ((4,), -2, (1, 4)),
    ],
)
def test_shape_and_values(shape, dim, want):
    layer, (x,) = make_layer(f"unsqueeze_param {{ dim: {dim} }}", [shape], type="Unsqueeze")
    top = layer(x)
    assert tuple(top.shape) == want and layer.output_shapes([shape]) == [want]
    np.testing.assert_array_equal(top.numpy().ravel(), x.numpy().ravel())


def test_no_gradient_flows_as_in_the_fork():
    layer, (x,) = make_layer("unsqueeze_param { dim: 0 }", [(2, 3)], type="Unsqueeze")
    x.requires_grad_(True)
    assert not layer.has_backward and not layer(x).requires_grad


@pytest.mark.parametrize(
    "snippet,match",
    [
        ("", "dim must be set"),
        ("unsqueeze_param { dim: 3 }", "out of range"),
        ("unsqueeze_param { dim: -4 }", "out of range"),
    ],
)
def test_errors(snippet, match):
    with pytest.raises(LayerParamError, match=rf"layer 'u' \(Unsqueeze\).*{match}"):
        make_layer(snippet, [(2, 3)], type="Unsqueeze", name="u")
