"""Concat: axis (negative allowed), legacy concat_dim, one bottom, and Caffe's shape checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError, LayerParamError

CASES = [
    LayerCase("Concat", "", ((2, 3, 4, 5), (2, 1, 4, 5), (2, 6, 4, 5))),
    LayerCase("Concat", "concat_param { axis: 0 }", ((2, 3, 4), (5, 3, 4))),
    LayerCase("Concat", "concat_param { axis: -1 }", ((2, 3, 4), (2, 3, 1))),
    LayerCase("Concat", "concat_param { concat_dim: 2 }", ((2, 3, 4, 5), (2, 3, 6, 5))),
    LayerCase("Concat", "", ((2, 3, 4, 5),), id="concat_single"),
]


def ref_concat(arrays, axis):
    """Caffe's loop: for each outer index n, copy each bottom's block in bottom order."""
    outer = int(np.prod(arrays[0].shape[:axis]))
    rows = [[a.reshape(outer, -1)[n] for a in arrays] for n in range(outer)]
    out = np.stack([np.concatenate(r) for r in rows])
    shape = list(arrays[0].shape)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    return out.reshape(shape)


@pytest.mark.parametrize(
    "snippet,shapes,axis",
    [
        ("", ((2, 3, 4, 5), (2, 1, 4, 5), (2, 6, 4, 5)), 1),
        ("concat_param { axis: 0 }", ((2, 3, 4), (5, 3, 4)), 0),
        ("concat_param { axis: -1 }", ((2, 3, 4), (2, 3, 1)), 2),
        ("concat_param { axis: -3 }", ((2, 3, 4), (4, 3, 4)), 0),
        ("concat_param { concat_dim: 2 }", ((2, 3, 4, 5), (2, 3, 6, 5)), 2),
        ("concat_param { concat_dim: 0 }", ((2, 3), (1, 3), (4, 3)), 0),
    ],
)
def test_forward_matches_reference(snippet, shapes, axis):
    layer, bottoms = make_layer(snippet, shapes, type="Concat", dtype=torch.float64)
    want = ref_concat([b.numpy() for b in bottoms], axis)
    top = layer(*bottoms)
    assert layer.output_shapes(shapes) == [want.shape]
    np.testing.assert_array_equal(top.numpy(), want)


def test_forward_single_bottom_is_identity():
    layer, (x,) = make_layer("", [(2, 3, 4)], type="Concat", dtype=torch.float64)
    np.testing.assert_array_equal(layer(x).numpy(), x.numpy())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,shapes,field",
    [
        ("concat_param { axis: 1 concat_dim: 1 }", ((2, 3), (2, 3)), "concat_dim"),
        ("concat_param { concat_dim: 3 }", ((2, 3, 4), (2, 3, 4)), "concat_dim"),
        ("concat_param { axis: 3 }", ((2, 3, 4), (2, 3, 4)), "axis"),
        ("concat_param { axis: -4 }", ((2, 3, 4), (2, 3, 4)), "axis"),
        ("", ((2, 3, 4), (2, 3)), "axes"),
        ("", ((2, 3, 4), (2, 3, 5)), "shape"),
    ],
)
def test_error(snippet, shapes, field):
    with pytest.raises(LayerParamError, match=rf"layer 'c1' \(Concat\).*{field}"):
        make_layer(snippet, shapes, type="Concat", name="c1")


def test_error_on_new_bottom_shapes():
    # checked when the net reshapes (output_shapes), not inside forward
    layer, _ = make_layer("", [(2, 3, 4), (2, 1, 4)], type="Concat", name="c1")
    with pytest.raises(LayerParamError, match=r"layer 'c1' \(Concat\).*shape"):
        layer.output_shapes([(2, 3, 4), (3, 1, 4)])


def test_error_needs_a_bottom():
    with pytest.raises(BlobWiringError, match=r"layer 'c1' \(Concat\).*bottom"):
        make_layer("", [], type="Concat", name="c1")
