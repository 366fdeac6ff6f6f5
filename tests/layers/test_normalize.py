"""Normalize (SSD): across_spatial or per position, shared or per-channel scale, eps inside
the root, 2-4 axis bottoms, and Caffe's backward (not the exact derivative when the per-channel
scales differ; the scale diff divides by the scale)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

UNIFORM = "scale_filler { type: 'constant' value: 2.5 }"
CASES = [
    LayerCase("Normalize", "", ((2, 3, 4, 5),), id="norm_default"),
    LayerCase(
        "Normalize",
        f"norm_param {{ across_spatial: false channel_shared: false {UNIFORM} }}",
        ((2, 4, 3, 5),),
        id="norm_channelwise",
    ),
    LayerCase("Normalize", "norm_param { across_spatial: false }", ((3, 5),), id="norm_2d"),
    LayerCase(
        "Normalize",
        "norm_param { channel_shared: false eps: 0.01 "
        "scale_filler { type: 'uniform' min: 0.5 max: 2 } }",
        ((2, 3, 4),),
        id="norm_3d_channel_scale",
    ),
]


def f32(v):
    return float(np.float32(v))


def _nchw(x):
    shape4 = tuple(x.shape) + (1,) * (4 - x.ndim)
    return x.reshape(shape4[0], shape4[1], -1)


def _scale(scale, c):
    return np.full((c, 1), scale) if np.ndim(scale) == 0 else np.asarray(scale).reshape(c, 1)


def ref_norm(x, scale, across_spatial, eps):
    """NormalizeLayer::Forward_cpu: norm = sqrt(sum x^2 + eps); top = x / norm * scale."""
    r = _nchw(x)
    axes = (1, 2) if across_spatial else (1,)
    norm = np.sqrt((r**2).sum(axis=axes, keepdims=True) + f32(eps))
    return (r / norm * _scale(scale, r.shape[1])).reshape(x.shape), norm


def ref_norm_diff(x, scale, across_spatial, eps, top_diff):
    """NormalizeLayer::Backward_cpu -> (bottom diff, scale diff)."""
    r, g = _nchw(x), _nchw(top_diff)
    top, norm = ref_norm(x, scale, across_spatial, eps)
    top = _nchw(top)
    axes = (1, 2) if across_spatial else (1,)
    a = (r * g).sum(axis=axes, keepdims=True)
    bottom = (g - r * a / norm / norm) / norm * _scale(scale, r.shape[1])
    if np.ndim(scale) == 0:
        scale_diff = np.array((top * g).sum() / scale)
    else:
        scale_diff = (top * g).sum(axis=(0, 2)) / scale
    return bottom.reshape(x.shape), scale_diff


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 5), (2, 4, 3)])
@pytest.mark.parametrize("across_spatial", [True, False])
@pytest.mark.parametrize("channel_shared", [True, False])
def test_forward_backward_match_reference(shape, across_spatial, channel_shared):
    rng = np.random.default_rng(5)
    snippet = (
        f"norm_param {{ across_spatial: {str(across_spatial).lower()} channel_shared: "
        f"{str(channel_shared).lower()} eps: 0.01 }}"
    )
    layer, _ = make_layer(snippet, [shape], type="Normalize", dtype=torch.float64)
    scale = rng.uniform(0.5, 3.0, () if channel_shared else (shape[1],))
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(scale))
    x = rng.standard_normal(shape) * 0.3
    xt = torch.tensor(x, requires_grad=True)
    top = layer(xt)
    want, _ = ref_norm(x, scale, across_spatial, 0.01)
    np.testing.assert_allclose(top.detach().numpy(), want, rtol=1e-12)
    assert layer.output_shapes([shape]) == [shape]
    top_diff = rng.standard_normal(shape)
    top.backward(torch.tensor(top_diff))
    want_x, want_scale = ref_norm_diff(x, scale, across_spatial, 0.01, top_diff)
    np.testing.assert_allclose(xt.grad.numpy(), want_x, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.weight.grad.numpy(), want_scale, rtol=1e-10)


def test_blob_shape_and_default_filler():
    shared, _ = make_layer("", [(2, 3, 4, 5)], type="Normalize")
    assert shared.weight.shape == () and float(shared.weight.detach()) == 1.0
    per_channel, _ = make_layer(
        "norm_param { channel_shared: false }", [(2, 3, 4, 5)], type="Normalize"
    )
    np.testing.assert_array_equal(per_channel.weight.detach().numpy(), np.ones(3))


def test_per_channel_backward_is_caffes_not_the_exact_derivative():
    layer, (x,) = make_layer(
        "norm_param { channel_shared: false across_spatial: false "
        "scale_filler { type: 'uniform' min: 0.5 max: 3 } }",
        [(2, 3, 2, 2)],
        type="Normalize",
        dtype=torch.float64,
    )
    xt = x.clone().requires_grad_(True)
    g = torch.randn(2, 3, 2, 2, dtype=torch.float64)
    (caffe_grad,) = torch.autograd.grad(layer(xt), xt, g)
    s = layer.weight.detach().reshape(1, 3, 1, 1)
    exact = xt / torch.sqrt((xt * xt).sum(1, keepdim=True) + f32(1e-10)) * s
    (exact_grad,) = torch.autograd.grad(exact, xt, g)
    assert not torch.allclose(caffe_grad, exact_grad, rtol=1e-3)


@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: c.name)
def test_gradient(case):
    # Caffe's gradient is the exact one when the scale is shared or uniform.
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "shape,match",
    [
        ((5,), "num_axes <= 4"),
        ((2, 3, 2, 2, 2), "num_axes <= 4"),
    ],
)
def test_error_bottom_axes(shape, match):
    with pytest.raises(LayerParamError, match=rf"layer 'n1' \(Normalize\).*{match}"):
        make_layer("", [shape], type="Normalize", name="n1")


def test_error_channels_change():
    layer, _ = make_layer(
        "norm_param { channel_shared: false }", [(2, 3, 4)], type="Normalize", name="n1"
    )
    with pytest.raises(LayerParamError, match=r"layer 'n1' \(Normalize\).*channels"):
        layer.output_shapes([(2, 4, 4)])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_normalize_is_the_float_one_rounded(dtype):
    # SSD's conv4_3 features reach hundreds: a float16 sum of squares over 512 channels is
    # inf; a zero position (after ReLU) is 0 / 0 when eps 1e-10 rounds to 0
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 512, 3, 3, generator=g) * 100).relu().to(dtype)
    x[0, :, 0, 0] = 0
    snippet = (
        "norm_param { across_spatial: false channel_shared: false"
        " scale_filler { type: 'constant' value: 20 } }"
    )
    layer, _ = make_layer(snippet, [x.shape], type="Normalize", bottoms=[x], dtype=dtype)
    ref, _ = make_layer(snippet, [x.shape], type="Normalize", bottoms=[x.float()])
    y = layer(x)
    assert y.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(y.float(), ref(x.float()), rtol=tol, atol=tol)
