"""Flatten: axis / end_axis (negative allowed, end_axis == axis - 1 inserts an axis), and
Caffe's checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Flatten"),
    LayerCase("Flatten", "flatten_param { axis: 2 }"),
    LayerCase("Flatten", "flatten_param { axis: 1 end_axis: 2 }"),
    LayerCase("Flatten", "flatten_param { axis: 0 end_axis: -2 }"),
]


def ref_flatten_shape(shape, axis, end_axis):
    """Caffe's Reshape: dims before axis, count(axis, end_axis + 1), dims after end_axis."""
    n = len(shape)
    a, e = axis % n, end_axis % n
    return tuple(shape[:a]) + (int(np.prod(shape[a : e + 1])),) + tuple(shape[e + 1 :])


@pytest.mark.parametrize(
    "snippet,shape,axis,end_axis",
    [
        ("", (2, 3, 4, 5), 1, -1),
        ("flatten_param { axis: 2 }", (2, 3, 4, 5), 2, -1),
        ("flatten_param { axis: 1 end_axis: 2 }", (2, 3, 4, 5), 1, 2),
        ("flatten_param { axis: -3 end_axis: -2 }", (2, 3, 4, 5), -3, -2),
        ("flatten_param { axis: 0 }", (2, 3, 4), 0, -1),
        ("flatten_param { axis: 2 end_axis: 1 }", (2, 3, 4, 5), 2, 1),
        ("flatten_param { axis: 3 end_axis: 3 }", (2, 3, 4, 5), 3, 3),
    ],
)
def test_forward_matches_reference(snippet, shape, axis, end_axis):
    layer, (x,) = make_layer(snippet, [shape], type="Flatten", dtype=torch.float64)
    want_shape = ref_flatten_shape(shape, axis, end_axis)
    top = layer(x)
    assert tuple(top.shape) == want_shape
    assert layer.output_shapes([shape]) == [want_shape]
    np.testing.assert_array_equal(top.numpy().ravel(), x.numpy().ravel())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,field",
    [
        ("flatten_param { axis: 4 }", "axis"),
        ("flatten_param { end_axis: -5 }", "end_axis"),
        ("flatten_param { axis: 3 end_axis: 1 }", "end_axis"),
    ],
)
def test_error(snippet, field):
    with pytest.raises(LayerParamError, match=rf"layer 'f1' \(Flatten\).*{field}"):
        make_layer(snippet, [(2, 3, 4, 5)], type="Flatten", name="f1")


def test_error_in_place():
    with pytest.raises(LayerParamError, match=r"layer 'f1' \(Flatten\).*in-place"):
        make_layer('bottom: "x" top: "x"', [(2, 3)], type="Flatten", name="f1")
