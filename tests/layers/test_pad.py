"""Pad (brocolli-caffe): constant / replicate / reflect, asymmetric, all-negative crop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Pad", "pad_param { pad_u: 1 pad_d: 2 pad_r: 3 pad_value: 1.5 }", id="constant"),
    LayerCase(
        "Pad", "pad_param { pad_type: REFLECT pad_u: 1 pad_d: 2 pad_l: 2 pad_r: 1 }", id="reflect"
    ),
    LayerCase("Pad", "pad_param { pad_type: REPLICATE pad_u: 2 pad_l: 3 }", id="replicate"),
]


def ref_pad(x, kind, u, d, left, right, value=0.0):
    """The fork's row loops, written with index arithmetic per top row and column."""
    n, c, h, w = x.shape
    if min(u, d, left, right) < 0:
        return x[:, :, -u : h + d, -left : w + right]
    top = np.full((n, c, h + u + d, w + left + right), value)

    def source(i, pad, size):
        k = i - pad
        if 0 <= k < size:
            return k
        if kind == "constant":
            return None
        if kind == "replicate":
            return min(max(k, 0), size - 1)
        return -k if k < 0 else 2 * (size - 1) - k  # reflect: the edge is not repeated

    for i in range(top.shape[2]):
        for j in range(top.shape[3]):
            si, sj = source(i, u, h), source(j, left, w)
            if si is not None and sj is not None:
                top[:, :, i, j] = x[:, :, si, sj]
    return top


@pytest.mark.parametrize("kind", ["CONSTANT", "REPLICATE", "REFLECT"])
@pytest.mark.parametrize("pads", [(1, 2, 0, 3), (2, 1, 3, 0), (0, 0, 0, 0), (1, 1, 1, 1)])
def test_forward_matches_the_forks_loops(kind, pads):
    u, d, left, right = pads
    snippet = (
        f"pad_param {{ pad_type: {kind} pad_u: {u} pad_d: {d} pad_l: {left} "
        f"pad_r: {right} pad_value: -0.75 }}"
    )
    layer, (x,) = make_layer(snippet, [(2, 2, 4, 5)], type="Pad", dtype=torch.float64)
    top = layer(x)
    want = ref_pad(x.numpy(), kind.lower(), u, d, left, right, -0.75)
    np.testing.assert_array_equal(top.numpy(), want)
    assert layer.output_shapes([(2, 2, 4, 5)]) == [want.shape]


def test_all_negative_pads_crop():
    layer, (x,) = make_layer(
        "pad_param { pad_u: -1 pad_d: -2 pad_l: -1 pad_r: -1 }", [(1, 2, 5, 6)], type="Pad"
    )
    np.testing.assert_array_equal(layer(x).numpy(), x.numpy()[:, :, 1:3, 1:5])


def test_no_gradient_flows_as_in_the_fork():
    layer, (x,) = make_layer("pad_param { pad_u: 1 }", [(1, 1, 2, 2)], type="Pad")
    x.requires_grad_(True)
    assert not layer.has_backward and not layer(x).requires_grad


@pytest.mark.parametrize(
    "snippet,shape,match",
    [
        ("pad_param { pad_u: -1 pad_d: 1 }", (1, 1, 3, 3), "negative pads must be all four"),
        (
            "pad_param { pad_type: REFLECT pad_l: 3 }",
            (1, 1, 3, 3),
            "REFLECT padding must be smaller",
        ),
        ("pad_param { pad_u: 1 }", (1, 3, 3), "4-D"),
        ("pad_param { pad_u: -2 pad_d: -2 pad_l: -1 pad_r: -1 }", (1, 1, 3, 3), "leaves nothing"),
    ],
)
def test_errors(snippet, shape, match):
    with pytest.raises(LayerParamError, match=rf"layer 'pad' \(Pad\).*{match}"):
        make_layer(snippet, [shape], type="Pad", name="pad")


def test_in_place_is_refused():
    with pytest.raises(LayerParamError, match="in-place"):
        make_layer("bottom: 'x' top: 'x' pad_param { pad_u: 1 }", [(1, 1, 2, 2)], type="Pad")
