"""SPP: per-level kernel/stride/pad (SPPLayer::GetPoolingParam), flatten + concat order,
the single-level shape, and the Pooling checks a level can fail."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from tests.layers.test_pooling import ref_pool
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("SPP", "spp_param { pyramid_height: 2 pool: MAX }", ((2, 3, 5, 7),)),
    LayerCase("SPP", "spp_param { pyramid_height: 3 pool: AVE }", ((2, 3, 9, 6),)),
    LayerCase("SPP", "spp_param { pyramid_height: 1 pool: AVE }", ((2, 3, 4, 5),)),
]


def ref_spp(x, height, pool):
    """Level l: 2^l bins, kernel = stride = ceil(size / 2^l), pad = (kernel * 2^l - size + 1)
    // 2 on each axis, then Caffe pooling; levels flattened per image and concatenated."""
    h, w = x.shape[2:]
    levels = []
    for level in range(height):
        bins = 2**level
        kernel = (math.ceil(h / bins), math.ceil(w / bins))
        pad = ((kernel[0] * bins - h + 1) // 2, (kernel[1] * bins - w + 1) // 2)
        levels.append(ref_pool(x, pool, kernel, kernel, pad)[0])
    if height == 1:
        return levels[0]
    return np.concatenate([t.reshape(x.shape[0], -1) for t in levels], axis=1)


@pytest.mark.parametrize(
    "height,pool,shape",
    [
        (2, "MAX", (2, 3, 5, 7)),
        (3, "AVE", (2, 3, 9, 6)),
        (3, "MAX", (2, 3, 12, 13)),
        (1, "AVE", (2, 3, 4, 5)),
        (4, "AVE", (1, 2, 16, 15)),
    ],
)
def test_forward_matches_reference(height, pool, shape):
    layer, (x,) = make_layer(
        f"spp_param {{ pyramid_height: {height} pool: {pool} }}",
        [shape],
        type="SPP",
        dtype=torch.float64,
    )
    top = layer(x).numpy()
    np.testing.assert_allclose(top, ref_spp(x.numpy(), height, pool), rtol=1e-12)


def test_forward_shapes():
    layer, (x,) = make_layer("spp_param { pyramid_height: 1 }", [(2, 3, 4, 5)], type="SPP")
    assert layer(x).shape == (2, 3, 1, 1)
    layer, (x,) = make_layer("spp_param { pyramid_height: 3 }", [(2, 3, 8, 8)], type="SPP")
    assert layer(x).shape == (2, 3 * (1 + 4 + 16))


def test_forward_stochastic_samples_from_each_bin():
    x = torch.rand(2, 3, 4, 4, dtype=torch.float64) + 0.1
    layer, _ = make_layer(
        "spp_param { pyramid_height: 2 pool: STOCHASTIC }",
        [(2, 3, 4, 4)],
        type="SPP",
        phase="TEST",
        dtype=torch.float64,
    )
    top = layer(x).numpy()  # level 0: (N, C), then level 1: (N, C * 4), channel-major
    level0, level1 = top[:, :3], top[:, 3:].reshape(2, 3, 4)
    xs = x.numpy()
    for n in range(2):
        for c in range(3):
            assert level0[n, c] in xs[n, c]  # a sample, even in TEST
            for b, (i, j) in enumerate([(0, 0), (0, 2), (2, 0), (2, 2)]):
                assert level1[n, c, b] in xs[n, c, i : i + 2, j : j + 2]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, step=1e-4)


@pytest.mark.parametrize(
    "snippet,shape,field",
    [
        ("spp_param { pool: MAX }", (2, 3, 4, 5), "pyramid_height"),
        ("spp_param { pyramid_height: 3 }", (2, 3, 3, 8), "pad"),
        ("spp_param { pyramid_height: 2 pool: STOCHASTIC }", (2, 3, 5, 4), "STOCHASTIC"),
        ("spp_param { pyramid_height: 2 }", (2, 3, 4), "4 axes"),
    ],
)
def test_error(snippet, shape, field):
    with pytest.raises(LayerParamError, match=rf"layer 's1' \(SPP\).*{field}"):
        make_layer(snippet, [shape], type="SPP", name="s1")
