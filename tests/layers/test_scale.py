"""Scale: learned scale (default filler 1) or bottom[1], optional learned bias (blob order
[scale, bias]; only [bias] with bottom[1]), axis / num_axes, scalars, gradients, shape errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

UNIFORM = "filler { type: 'uniform' min: -1 max: 1 }"
BIAS_UNIFORM = "bias_filler { type: 'uniform' min: -1 max: 1 }"

CASES = [
    LayerCase("Scale", f"scale_param {{ {UNIFORM} }}", id="scale_param"),
    LayerCase(
        "Scale",
        f"scale_param {{ bias_term: true {UNIFORM} {BIAS_UNIFORM} }}",
        id="scale_param_bias",
    ),
    LayerCase(
        "Scale",
        f"scale_param {{ axis: -2 num_axes: -1 bias_term: true {UNIFORM} {BIAS_UNIFORM} }}",
        id="scale_param_tail_bias",
    ),
    LayerCase("Scale", f"scale_param {{ num_axes: 0 {UNIFORM} }}", id="scale_scalar"),
    LayerCase(
        "Scale",
        f"scale_param {{ axis: 0 bias_term: true {BIAS_UNIFORM} }}",
        ((2, 3, 4), (2, 3)),
        id="scale_2bottoms_bias",
    ),
    LayerCase(
        "Scale",
        "scale_param { axis: 0 }",
        ((2, 3, 4, 5), (2, 3, 4, 5)),
        id="scale_2bottoms_eltwise",
    ),
]


def ref_scale(x, s, axis, b=None):
    """Caffe's loops: top[n, d, :] = x[n, d, :] * s[d] (+ b[d])."""
    outer = int(np.prod(x.shape[:axis]))
    dim = s.size
    xs = x.reshape(outer, dim, -1)
    y = xs * s.reshape(1, dim, 1)
    if b is not None:
        y = y + b.reshape(1, dim, 1)
    return y.reshape(x.shape)


def ref_scale_diff(x, s, axis, top_diff):
    """-> (bottom diff, scale diff, bias diff)."""
    outer = int(np.prod(x.shape[:axis]))
    dim = s.size
    td = top_diff.reshape(outer, dim, -1)
    bottom = (td * s.reshape(1, dim, 1)).reshape(x.shape)
    scale = (td * x.reshape(outer, dim, -1)).sum(axis=(0, 2)).reshape(s.shape)
    bias = td.sum(axis=(0, 2)).reshape(s.shape)
    return bottom, scale, bias


@pytest.mark.parametrize(
    "params,shape,axis,s_shape",
    [
        ("", (2, 3, 4, 5), 1, (3,)),
        ("axis: 0 num_axes: 2", (2, 3, 4, 5), 0, (2, 3)),
        ("axis: -1", (2, 3, 4, 5), 3, (5,)),
        ("axis: 1 num_axes: -1", (2, 3, 4), 1, (3, 4)),
        ("axis: 0 num_axes: -1", (2, 3, 4), 0, (2, 3, 4)),  # Caffe's eltwise branch
        ("axis: 2 num_axes: 0", (2, 3, 4), 0, ()),
    ],
)
def test_learned_scale_bias_match_reference(params, shape, axis, s_shape):
    snippet = f"scale_param {{ {params} bias_term: true {UNIFORM} {BIAS_UNIFORM} }}"
    layer, (x,) = make_layer(snippet, [shape], type="Scale", dtype=torch.float64)
    weight, bias = layer.param_blobs()
    assert tuple(weight.shape) == s_shape and tuple(bias.shape) == s_shape
    s, b = weight.detach().numpy().copy(), bias.detach().numpy().copy()
    xt = x.clone().requires_grad_(True)
    top = layer(xt)
    np.testing.assert_allclose(top.detach().numpy(), ref_scale(x.numpy(), s, axis, b), rtol=1e-12)
    top_diff = np.random.default_rng(4).standard_normal(shape)
    top.backward(torch.tensor(top_diff))
    want_bottom, want_scale, want_bias = ref_scale_diff(x.numpy(), s, axis, top_diff)
    np.testing.assert_allclose(xt.grad.numpy(), want_bottom, rtol=1e-12)
    np.testing.assert_allclose(weight.grad.numpy(), want_scale, rtol=1e-10)
    np.testing.assert_allclose(bias.grad.numpy(), want_bias, rtol=1e-10)


@pytest.mark.parametrize(
    "params,shapes,axis,bias_shape",
    [
        ("", ((2, 3, 4, 5), (3, 4)), 1, None),
        ("axis: 0 bias_term: true", ((2, 3, 4), (2, 3)), 0, (2, 3)),
        ("axis: -2", ((2, 3, 4, 5), (4, 5)), 2, None),
        ("axis: 9", ((2, 3, 4), ()), 0, None),  # scalar: axis never read
        ("bias_term: true", ((2, 3, 4), ()), 0, ()),
    ],
)
def test_bottom_scale_matches_reference(params, shapes, axis, bias_shape):
    snippet = f"scale_param {{ {params} {BIAS_UNIFORM} }}"
    layer, (x, s) = make_layer(snippet, shapes, type="Scale", dtype=torch.float64)
    blobs = layer.param_blobs()
    assert [tuple(p.shape) for p in blobs] == ([] if bias_shape is None else [bias_shape])
    b = blobs[0].detach().numpy().copy() if blobs else None
    st = s.clone().requires_grad_(True)
    xt = x.clone().requires_grad_(True)
    top = layer(xt, st)
    np.testing.assert_allclose(
        top.detach().numpy(), ref_scale(x.numpy(), s.numpy(), axis, b), rtol=1e-12
    )
    top_diff = np.random.default_rng(5).standard_normal(shapes[0])
    top.backward(torch.tensor(top_diff))
    want_bottom, want_scale, want_bias = ref_scale_diff(x.numpy(), s.numpy(), axis, top_diff)
    np.testing.assert_allclose(xt.grad.numpy(), want_bottom, rtol=1e-12)
    np.testing.assert_allclose(st.grad.numpy(), want_scale, rtol=1e-10)
    if blobs:
        np.testing.assert_allclose(blobs[0].grad.numpy(), want_bias, rtol=1e-10)


def test_default_fillers_identity():
    layer, (x,) = make_layer("scale_param { bias_term: true }", [(2, 3, 4)], type="Scale")
    weight, bias = layer.param_blobs()
    assert torch.all(weight == 1) and torch.all(bias == 0)
    torch.testing.assert_close(layer(x), x)
    assert layer.blob_names == ["weight", "bias"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,shapes,what",
    [
        ("scale_param { axis: 3 }", ((2, 3, 4),), r"scale_param\.axis"),
        ("scale_param { axis: 3 num_axes: 0 }", ((2, 3, 4),), r"scale_param\.axis"),
        ("scale_param { num_axes: -3 }", ((2, 3, 4),), r"num_axes must be non-negative"),
        ("scale_param { axis: 1 num_axes: 3 }", ((2, 3, 4),), r"scale blob's shape extends"),
        ("", ((2, 3, 4), (4,)), r"dimension mismatch.*expected \[3\], got \[4\]"),
        ("scale_param { axis: 2 }", ((2, 3, 4), (4, 2)), r"scale blob's shape extends"),
        ("scale_param { axis: 9 bias_term: true }", ((2, 3, 4), ()), r"scale_param\.axis"),
    ],
)
def test_error(snippet, shapes, what):
    with pytest.raises(LayerParamError, match=rf"layer 's1' \(Scale\).*{what}"):
        make_layer(snippet, shapes, type="Scale", name="s1")
