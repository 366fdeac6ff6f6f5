"""Tile: axis (negative allowed) and tiles; backward sums the copies; tiles is required."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Tile", "tile_param { tiles: 3 }", ((2, 3, 4),)),
    LayerCase("Tile", "tile_param { axis: -1 tiles: 2 }"),
    LayerCase("Tile", "tile_param { axis: 0 tiles: 2 }", ((3, 4),)),
]


def ref_tile(x, axis, tiles):
    """Caffe's loop: for each outer index, copy the inner block shape[axis:] ``tiles`` times."""
    outer = int(np.prod(x.shape[:axis]))
    blocks = x.reshape(outer, -1)
    out = np.concatenate([np.concatenate([blocks[i]] * tiles) for i in range(outer)])
    shape = list(x.shape)
    shape[axis] *= tiles
    return out.reshape(shape)


def ref_tile_diff(top_diff, shape, axis, tiles):
    """Backward: the diff of each copy added into the block it came from."""
    outer = int(np.prod(shape[:axis]))
    return top_diff.reshape(outer, tiles, -1).sum(1).reshape(shape)


@pytest.mark.parametrize(
    "snippet,shape,axis,tiles",
    [
        ("tile_param { tiles: 3 }", (2, 3, 4), 1, 3),
        ("tile_param { axis: -1 tiles: 2 }", (2, 3, 4, 5), 3, 2),
        ("tile_param { axis: 0 tiles: 2 }", (3, 4), 0, 2),
        ("tile_param { axis: 2 tiles: 1 }", (2, 3, 4), 2, 1),
    ],
)
def test_forward_backward_match_reference(snippet, shape, axis, tiles):
    layer, (x,) = make_layer(snippet, [shape], type="Tile", dtype=torch.float64)
    x = x.requires_grad_(True)
    top = layer(x)
    want = ref_tile(x.detach().numpy(), axis, tiles)
    np.testing.assert_array_equal(top.detach().numpy(), want)
    assert layer.output_shapes([shape]) == [want.shape]
    top_diff = np.random.default_rng(0).standard_normal(want.shape)
    top.backward(torch.tensor(top_diff))
    np.testing.assert_allclose(
        x.grad.numpy(), ref_tile_diff(top_diff, shape, axis, tiles), rtol=1e-12
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,field",
    [
        ("", "tiles"),
        ("tile_param { axis: 1 }", "tiles"),
        ("tile_param { tiles: 0 }", "tiles"),
        ("tile_param { tiles: -2 }", "tiles"),
        ("tile_param { axis: 3 tiles: 2 }", "axis"),
    ],
)
def test_error(snippet, field):
    with pytest.raises(LayerParamError, match=rf"layer 't1' \(Tile\).*{field}"):
        make_layer(snippet, [(2, 3, 4)], type="Tile", name="t1")
