"""Bias: learned blob or bottom[1], axis (negative allowed), num_axes (-1: to the end), a
scalar bias ignoring axis, the gradient summed over broadcast axes, shape errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

UNIFORM = "filler { type: 'uniform' min: -1 max: 1 }"

CASES = [
    LayerCase("Bias", f"bias_param {{ {UNIFORM} }}", id="bias_param_default"),
    LayerCase("Bias", f"bias_param {{ axis: -2 num_axes: -1 {UNIFORM} }}", id="bias_param_tail"),
    LayerCase("Bias", "", ((2, 3, 4, 5), (3, 4)), id="bias_2bottoms"),
    LayerCase("Bias", "bias_param { axis: 0 }", ((2, 3, 4), ()), id="bias_2bottoms_scalar"),
]


def ref_bias(x, b, axis):
    """Caffe's loop: for each outer index n, top[n, d, :] = x[n, d, :] + b[d]."""
    outer = int(np.prod(x.shape[:axis]))
    bias_dim = b.size
    inner = x.size // (outer * bias_dim)
    xs = x.reshape(outer, bias_dim, inner)
    return (xs + b.reshape(1, bias_dim, 1)).reshape(x.shape)


def ref_bias_diff(top_diff, b_shape, axis):
    outer = int(np.prod(top_diff.shape[:axis]))
    bias_dim = int(np.prod(b_shape))
    return top_diff.reshape(outer, bias_dim, -1).sum(axis=(0, 2)).reshape(b_shape)


@pytest.mark.parametrize(
    "snippet,shape,axis,b_shape",
    [
        ("", (2, 3, 4, 5), 1, (3,)),
        ("bias_param { axis: 0 num_axes: 2 }", (2, 3, 4, 5), 0, (2, 3)),
        ("bias_param { axis: -1 }", (2, 3, 4, 5), 3, (5,)),
        ("bias_param { axis: 2 num_axes: -1 }", (2, 3, 4, 5), 2, (4, 5)),
        ("bias_param { axis: 1 num_axes: 0 }", (2, 3, 4), 0, ()),
    ],
)
def test_learned_bias_matches_reference(snippet, shape, axis, b_shape):
    snippet = snippet or "bias_param { }"
    snippet = snippet[:-1] + UNIFORM + " }"
    layer, (x,) = make_layer(snippet, [shape], type="Bias", dtype=torch.float64)
    assert tuple(layer.bias.shape) == b_shape
    b = layer.bias.detach().numpy().copy()
    top = layer(x)
    np.testing.assert_allclose(top.detach().numpy(), ref_bias(x.numpy(), b, axis), rtol=1e-12)
    top_diff = np.random.default_rng(1).standard_normal(shape)
    top.backward(torch.tensor(top_diff))
    np.testing.assert_allclose(
        layer.bias.grad.numpy(), ref_bias_diff(top_diff, b_shape, axis), rtol=1e-10
    )


@pytest.mark.parametrize(
    "snippet,shapes,axis",
    [
        ("", ((2, 3, 4, 5), (3, 4)), 1),
        ("bias_param { axis: -3 }", ((2, 3, 4, 5), (3, 4, 5)), 1),
        ("bias_param { axis: 0 }", ((2, 3, 4), (2,)), 0),
        ("bias_param { axis: 7 }", ((2, 3, 4), ()), 0),  # scalar: axis ignored
    ],
)
def test_bottom_bias_matches_reference(snippet, shapes, axis):
    layer, (x, b) = make_layer(snippet, shapes, type="Bias", dtype=torch.float64)
    assert layer.param_blobs() == []
    b = b.requires_grad_(True)
    top = layer(x, b)
    np.testing.assert_allclose(
        top.detach().numpy(), ref_bias(x.numpy(), b.detach().numpy(), axis), rtol=1e-12
    )
    top_diff = np.random.default_rng(2).standard_normal(shapes[0])
    top.backward(torch.tensor(top_diff))
    np.testing.assert_allclose(b.grad.numpy(), ref_bias_diff(top_diff, shapes[1], axis), rtol=1e-10)


def test_default_filler_is_zero():
    layer, _ = make_layer("bias_param { num_axes: 2 }", [(2, 3, 4)], type="Bias")
    assert tuple(layer.bias.shape) == (3, 4) and torch.all(layer.bias == 0)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,shapes,what",
    [
        ("bias_param { axis: 4 }", ((2, 3, 4, 5),), r"bias_param\.axis"),
        ("bias_param { axis: -5 }", ((2, 3, 4, 5),), r"bias_param\.axis"),
        ("bias_param { num_axes: -2 }", ((2, 3, 4, 5),), r"num_axes must be non-negative"),
        ("bias_param { axis: 2 num_axes: 3 }", ((2, 3, 4, 5),), r"extends past bottom\[0\]"),
        ("", ((2, 3, 4, 5), (4,)), r"dimension mismatch.*expected \[3\], got \[4\]"),
        ("bias_param { axis: 2 }", ((2, 3, 4, 5), (4, 5, 6)), r"extends past bottom\[0\]"),
        ("bias_param { axis: 4 }", ((2, 3, 4, 5), (3,)), r"bias_param\.axis"),
    ],
)
def test_error(snippet, shapes, what):
    with pytest.raises(LayerParamError, match=rf"layer 'b1' \(Bias\).*{what}"):
        make_layer(snippet, shapes, type="Bias", name="b1")


def test_error_bottom_reshaped_to_mismatch():
    layer, _ = make_layer("", [(2, 3, 4), (3,)], type="Bias", name="b1")
    with pytest.raises(LayerParamError, match=r"layer 'b1' \(Bias\).*dimension mismatch"):
        layer.output_shapes([(2, 4, 4), (3,)])  # once per input shape, not inside forward
