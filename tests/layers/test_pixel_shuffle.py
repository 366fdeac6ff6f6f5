"""PixelShuffle (brocolli-caffe): depth to space with the fork's channel order; no backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("PixelShuffle", "pixelshuffle_param { upscale_factor: 2 }", ((2, 8, 3, 4),), id="r2"),
    LayerCase("PixelShuffle", "pixelshuffle_param { upscale_factor: 3 }", ((1, 9, 2, 2),), id="r3"),
]


def ref_pixel_shuffle(x, r):
    """The fork's loops: top(n, p, i*r + sh, j*r + sw) = bottom(n, p*r*r + sh*r + sw, i, j)."""
    n, c, h, w = x.shape
    out_c = c // (r * r)
    top = np.empty((n, out_c, h * r, w * r))
    for p in range(out_c):
        for sh in range(r):
            for sw in range(r):
                top[:, p, sh::r, sw::r] = x[:, p * r * r + sh * r + sw]
    return top


@pytest.mark.parametrize(
    "shape,r", [((2, 8, 3, 4), 2), ((1, 9, 2, 2), 3), ((2, 6, 2, 3), 2), ((1, 3, 2, 2), 1)]
)
def test_forward_matches_the_forks_loops(shape, r):
    layer, (x,) = make_layer(
        f"pixelshuffle_param {{ upscale_factor: {r} }}",
        [shape],
        type="PixelShuffle",
        dtype=torch.float64,
    )
    top = layer(x)
    want = ref_pixel_shuffle(x.numpy(), r)  # (2, 6, ...) r=2: C % r == 0 but not r^2
    np.testing.assert_array_equal(top.numpy(), want)
    assert layer.output_shapes([shape]) == [want.shape]


def test_no_gradient_flows_as_in_the_fork():
    layer, (x,) = make_layer(
        "pixelshuffle_param { upscale_factor: 2 }", [(1, 4, 2, 2)], type="PixelShuffle"
    )
    x.requires_grad_(True)
    assert not layer.has_backward and not layer(x).requires_grad


@pytest.mark.parametrize(
    "snippet,shape,match",
    [
        ("", (1, 4, 2, 2), "upscale_factor must be set"),
        ("pixelshuffle_param { upscale_factor: 2 }", (1, 5, 2, 2), "divisible by upscale_factor"),
        ("pixelshuffle_param { upscale_factor: 2 }", (4, 2, 2), "4-D"),
    ],
)
def test_errors(snippet, shape, match):
    with pytest.raises(LayerParamError, match=rf"layer 'ps' \(PixelShuffle\).*{match}"):
        make_layer(snippet, [shape], type="PixelShuffle", name="ps")
