"""Slice: slice_point boundaries or an equal split, axis / legacy slice_dim, one top, and
Caffe's checks on the points."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase(
        "Slice", "slice_param { axis: 1 slice_point: 1 slice_point: 3 }", ((2, 5, 3, 4),), n_tops=3
    ),
    LayerCase("Slice", "slice_param { axis: 0 }", ((4, 3, 2, 5),), n_tops=2),
    LayerCase("Slice", "slice_param { axis: -1 slice_point: 2 }", ((2, 3, 5),), n_tops=2),
    LayerCase("Slice", "slice_param { slice_dim: 2 }", ((2, 3, 6, 5),), n_tops=3),
    LayerCase("Slice", "", ((2, 3, 4),), n_tops=1, id="slice_single"),
]


def ref_slice(x, axis, n_tops, points):
    """Top i covers [points[i-1], points[i]) of the axis (points padded with 0 and the size);
    without points the axis is cut into n_tops equal parts."""
    size = x.shape[axis]
    if not points:
        points = [size // n_tops * i for i in range(1, n_tops)]
    edges = [0, *points, size]
    return [np.take(x, np.arange(lo, hi), axis=axis) for lo, hi in zip(edges, edges[1:])]


@pytest.mark.parametrize(
    "snippet,shape,n_tops,axis,points",
    [
        ("slice_param { axis: 1 slice_point: 1 slice_point: 3 }", (2, 5, 3, 4), 3, 1, [1, 3]),
        ("slice_param { axis: 0 }", (4, 3, 2, 5), 2, 0, []),
        ("slice_param { axis: 2 slice_point: 4 }", (2, 3, 6, 5), 2, 2, [4]),
        ("slice_param { axis: -1 slice_point: 2 }", (2, 3, 5), 2, 2, [2]),
        ("slice_param { slice_dim: 2 }", (2, 3, 6, 5), 3, 2, []),
        ("", (2, 6, 5), 3, 1, []),
        ("slice_param { axis: 1 slice_point: 2 slice_point: 5 }", (2, 5, 3), 3, 1, [2, 5]),
    ],
)
def test_forward_matches_reference(snippet, shape, n_tops, axis, points):
    layer, (x,) = make_layer(snippet, [shape], type="Slice", n_tops=n_tops, dtype=torch.float64)
    want = ref_slice(x.numpy(), axis, n_tops, points)
    tops = layer(x)
    tops = tops if isinstance(tops, tuple) else (tops,)
    assert layer.output_shapes([shape]) == [w.shape for w in want]
    assert len(tops) == len(want)
    for got, w in zip(tops, want):
        np.testing.assert_array_equal(got.numpy(), w)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,shape,n_tops,field",
    [
        ("slice_param { axis: 1 slice_dim: 1 }", (2, 4), 2, "slice_dim"),
        ("slice_param { slice_dim: 3 }", (2, 4, 6), 2, "slice_dim"),
        ("slice_param { axis: 3 }", (2, 4, 6), 2, "axis"),
        ("slice_param { axis: 1 }", (2, 5, 6), 2, "evenly divide"),
        ("slice_param { slice_point: 1 }", (2, 5, 6), 3, "slice_point"),
        ("slice_param { slice_point: 2 slice_point: 2 }", (2, 5, 6), 3, "slice_point"),
        ("slice_param { slice_point: 0 }", (2, 5, 6), 2, "slice_point"),
        ("slice_param { slice_point: 6 }", (2, 5, 6), 2, "slice_point"),
        ("slice_param { slice_point: 1 slice_point: 2 }", (2, 2, 6), 3, "tops"),
    ],
)
def test_error(snippet, shape, n_tops, field):
    with pytest.raises(LayerParamError, match=rf"layer 's1' \(Slice\).*{field}"):
        make_layer(snippet, [shape], type="Slice", n_tops=n_tops, name="s1")
