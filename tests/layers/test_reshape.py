"""Reshape: 0 copies a dim, -1 infers one, axis / num_axes choose the replaced range (num_axes
0 inserts axes, negative axis counts from after the last axis), and Caffe's checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Reshape", "reshape_param { shape { dim: 0 dim: -1 dim: 2 } }"),
    LayerCase("Reshape", "reshape_param { shape { dim: -1 } axis: 1 num_axes: 2 }"),
    LayerCase(
        "Reshape", "reshape_param { shape { dim: 1 dim: 1 } axis: 2 num_axes: 0 }", ((2, 3, 4),)
    ),
    LayerCase("Reshape", "reshape_param { shape { dim: 6 dim: 20 } }"),
]


def _shape(dims):
    return "shape { " + " ".join(f"dim: {d}" for d in dims) + " }"


def ref_reshape_shape(shape, dims, axis=0, num_axes=-1):
    """Caffe's ReshapeLayer::Reshape, spelled out."""
    start = axis if axis >= 0 else len(shape) + axis + 1
    end = len(shape) if num_axes == -1 else start + num_axes
    top = list(shape[:start]) + list(dims) + list(shape[end:])
    for i, d in enumerate(dims):
        if d == 0:
            top[start + i] = shape[start + i]
    if -1 in dims:
        j = start + list(dims).index(-1)
        top[j] = int(np.prod(shape)) // int(np.prod([d for k, d in enumerate(top) if k != j]))
    return tuple(top)


@pytest.mark.parametrize(
    "dims,axis,num_axes,shape",
    [
        ((0, -1, 2), 0, -1, (2, 3, 4, 5)),
        ((-1,), 1, 2, (2, 3, 4, 5)),
        ((1, 1), 2, 0, (2, 3, 4)),
        ((6, 20), 0, -1, (2, 3, 4, 5)),
        ((0, 0, -1), 0, -1, (2, 3, 4, 5)),
        ((1, 1), -1, -1, (2, 3, 4)),
        ((1,), -1, 0, (2, 3, 4)),
        ((-1, 0), -3, 2, (2, 3, 4, 5)),
        ((1, 0, -1), 1, 2, (2, 3, 4, 5)),
        ((), 1, 0, (2, 3)),
        ((4, 5), 2, 1, (2, 3, 20)),
    ],
)
def test_forward_matches_reference(dims, axis, num_axes, shape):
    snippet = f"reshape_param {{ {_shape(dims)} axis: {axis} num_axes: {num_axes} }}"
    layer, (x,) = make_layer(snippet, [shape], type="Reshape", dtype=torch.float64)
    want = ref_reshape_shape(shape, dims, axis, num_axes)
    top = layer(x)
    assert tuple(top.shape) == want
    assert layer.output_shapes([shape]) == [want]
    np.testing.assert_array_equal(top.numpy().ravel(), x.numpy().ravel())


@pytest.mark.parametrize("snippet", ["", "reshape_param { }", "reshape_param { shape { } }"])
def test_no_shape_makes_a_one_element_bottom_a_scalar(snippet):
    """Caffe's Reshape with no dims replaces every axis with none: a bottom of one element
    becomes a 0-axis top (count 1), at set-up and in forward alike."""
    layer, (x,) = make_layer(snippet, [(1, 1)], type="Reshape")
    assert layer.output_shapes([(1, 1)]) == [()]
    assert layer(x).shape == () and layer(x).item() == x.item()


def test_forward_new_bottom_shape_reinfers():
    layer, _ = make_layer("reshape_param { shape { dim: 0 dim: -1 } }", [(2, 3, 4)], type="Reshape")
    assert layer(torch.zeros(5, 2, 3)).shape == (5, 6)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,shape,field",
    [
        ("reshape_param { shape { dim: -1 dim: -1 } }", (2, 3), "-1"),
        ("reshape_param { shape { dim: -2 dim: 3 } }", (2, 3), "dims"),
        ("reshape_param { shape { dim: 6 } num_axes: -2 }", (2, 3), "num_axes"),
        ("reshape_param { shape { dim: 6 } axis: 3 }", (2, 3), "axis"),
        ("reshape_param { shape { dim: 6 } axis: -4 }", (2, 3), "axis"),
        ("reshape_param { shape { dim: 1 } axis: 1 num_axes: 2 }", (2, 3), "num_axes"),
        ("reshape_param { shape { dim: 0 dim: 0 } axis: 1 }", (2, 3), "0"),
        ("reshape_param { shape { dim: 4 dim: -1 } }", (2, 3), "divisible"),
        ("reshape_param { shape { dim: 0 dim: -1 } }", (0, 3), "divisible"),
        ("reshape_param { shape { dim: 5 } }", (2, 3), "count"),
    ],
)
def test_error(snippet, shape, field):
    with pytest.raises(LayerParamError, match=rf"layer 'r1' \(Reshape\).*{field}"):
        make_layer(snippet, [shape], type="Reshape", name="r1")


def test_error_in_place():
    with pytest.raises(LayerParamError, match=r"layer 'r1' \(Reshape\).*in-place"):
        make_layer(
            'bottom: "x" top: "x" reshape_param { shape { dim: -1 } }',
            [(2, 3)],
            type="Reshape",
            name="r1",
        )
