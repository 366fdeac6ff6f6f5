"""Crop: axis (default 2, negative allowed), one or per-axis offsets, the reference bottom's
shape, gradient only to bottom 0, and Caffe's checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError, LayerParamError

CASES = [
    LayerCase("Crop", "", ((2, 3, 6, 7), (2, 3, 4, 5))),
    LayerCase("Crop", "crop_param { axis: 1 offset: 1 }", ((2, 5, 6, 7), (1, 3, 4, 5))),
    LayerCase("Crop", "crop_param { axis: 2 offset: 1 offset: 2 }", ((2, 3, 6, 7), (4, 1, 4, 5))),
]


def ref_crop(x, ref_shape, axis, offsets):
    """Axes before ``axis`` kept whole; axis i >= axis keeps ref_shape[i] entries from its
    offset (one offset for all, or one per cropped axis, default 0)."""
    index = []
    for i in range(x.ndim):
        if i < axis:
            index.append(slice(None))
            continue
        off = 0 if not offsets else offsets[0] if len(offsets) == 1 else offsets[i - axis]
        index.append(slice(off, off + ref_shape[i]))
    return x[tuple(index)]


@pytest.mark.parametrize(
    "snippet,shapes,axis,offsets",
    [
        ("", ((2, 3, 6, 7), (2, 3, 4, 5)), 2, []),
        ("crop_param { axis: 1 offset: 1 }", ((2, 5, 6, 7), (1, 3, 4, 5)), 1, [1]),
        ("crop_param { axis: 2 offset: 1 offset: 2 }", ((2, 3, 6, 7), (4, 1, 4, 5)), 2, [1, 2]),
        ("crop_param { axis: -1 offset: 3 }", ((2, 3, 6, 7), (1, 1, 1, 4)), 3, [3]),
        (
            "crop_param { axis: 0 offset: 1 offset: 0 offset: 2 }",
            ((3, 4, 6), (2, 4, 3, 9)),
            0,
            [1, 0, 2],
        ),
    ],
)
def test_forward_matches_reference(snippet, shapes, axis, offsets):
    layer, (x, ref) = make_layer(snippet, shapes, type="Crop", dtype=torch.float64)
    want = ref_crop(x.numpy(), ref.shape, axis, offsets)
    top = layer(x, ref)
    assert top.shape == want.shape
    np.testing.assert_array_equal(top.numpy(), want)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient_to_data_bottom_only(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0])
    x, ref = (b.double().requires_grad_(True) for b in bottoms)
    top = layer.double()(x, ref)
    top.sum().backward()
    assert ref.grad is None  # Caffe leaves bottom 1's diff at zero
    assert x.grad.sum() == top.numel() and set(x.grad.unique().tolist()) == {0.0, 1.0}


@pytest.mark.parametrize(
    "snippet,shapes,field",
    [
        ("crop_param { axis: 1 offset: 1 offset: 1 }", ((2, 3, 6, 7), (2, 3, 4, 5)), "offset"),
        ("crop_param { offset: 3 }", ((2, 3, 6, 7), (2, 3, 4, 5)), "out of bounds"),
        ("crop_param { axis: 4 }", ((2, 3, 6, 7), (2, 3, 4, 5)), "axis"),
        ("", ((2, 3, 6, 7), (2, 3, 4)), "axes"),
    ],
)
def test_error(snippet, shapes, field):
    with pytest.raises(LayerParamError, match=rf"layer 'k1' \(Crop\).*{field}"):
        make_layer(snippet, shapes, type="Crop", name="k1")


def test_error_needs_two_bottoms():
    with pytest.raises(BlobWiringError, match=r"layer 'k1' \(Crop\).*bottom"):
        make_layer("", [(2, 3, 6, 7)], type="Crop", name="k1")
