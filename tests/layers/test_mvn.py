"""MVN: per (n, c) or per-sample groups, mean-only, eps added after the square root, the legacy
4-D top shape, and Caffe's backward (every term over std + eps, not the exact derivative)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcaffe as caffe
from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("MVN", "", ((2, 3, 4, 5),), id="mvn_default"),
    LayerCase("MVN", "mvn_param { across_channels: true }", ((3, 2, 5, 4),), id="mvn_across"),
    LayerCase("MVN", "mvn_param { normalize_variance: false }", ((2, 4, 3),), id="mvn_mean"),
    LayerCase("MVN", "mvn_param { across_channels: true eps: 0.5 }", ((4, 3),), id="mvn_2d_eps"),
]


def f32(v):
    return float(np.float32(v))


def _groups(x, across_channels):
    shape4 = tuple(x.shape) + (1,) * (4 - x.ndim)
    n = shape4[0] if across_channels else shape4[0] * shape4[1]
    return x.reshape(n, -1), shape4


def ref_mvn(x, normalize_variance=True, across_channels=False, eps=1e-9):
    """MVNLayer::Forward_cpu: X - EX, then / (sqrt(E((X - EX)^2)) + eps); top is 4-D."""
    rows, shape4 = _groups(x, across_channels)
    centered = rows - rows.mean(axis=1, keepdims=True)
    if not normalize_variance:
        return centered.reshape(shape4)
    std = np.sqrt((centered**2).mean(axis=1, keepdims=True))
    return (centered / (std + f32(eps))).reshape(shape4)


def ref_mvn_diff(x, top_diff, normalize_variance=True, across_channels=False, eps=1e-9):
    """MVNLayer::Backward_cpu, step by step on the (groups, dim) view."""
    rows, shape4 = _groups(x, across_channels)
    g = top_diff.reshape(rows.shape)
    dim = rows.shape[1]
    if not normalize_variance:
        return (g - g.sum(axis=1, keepdims=True) / dim).reshape(shape4)
    y = ref_mvn(x, True, across_channels, eps).reshape(rows.shape)
    variance = np.sqrt(((rows - rows.mean(axis=1, keepdims=True)) ** 2).mean(axis=1, keepdims=True))
    variance = variance + f32(eps)
    bottom = y * (y * g).sum(axis=1, keepdims=True)
    bottom = bottom + g.sum(axis=1, keepdims=True)
    bottom = g - bottom / dim
    return (bottom / variance).reshape(shape4)


@pytest.mark.parametrize(
    "snippet,shape,kw",
    [
        ("", (2, 3, 4, 5), {}),
        (
            "mvn_param { across_channels: true eps: 1e-3 }",
            (3, 2, 5, 4),
            {"across_channels": True, "eps": 1e-3},
        ),
        ("mvn_param { normalize_variance: false }", (2, 4, 3), {"normalize_variance": False}),
        (
            "mvn_param { normalize_variance: false across_channels: true }",
            (3, 2, 2, 5),
            {"normalize_variance": False, "across_channels": True},
        ),
        ("mvn_param { eps: 0.75 }", (2, 3, 5), {"eps": 0.75}),
        (
            "mvn_param { across_channels: true eps: 0.25 }",
            (4, 3),
            {"across_channels": True, "eps": 0.25},
        ),
    ],
)
def test_forward_backward_match_reference(snippet, shape, kw):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape) * 2 + 0.5
    layer, _ = make_layer(snippet, [shape], type="MVN", dtype=torch.float64)
    xt = torch.tensor(x, requires_grad=True)
    top = layer(xt)
    want = ref_mvn(x, **kw)
    assert tuple(top.shape) == want.shape == layer.output_shapes([shape])[0]
    np.testing.assert_allclose(top.detach().numpy(), want, rtol=1e-12, atol=1e-14)
    top_diff = rng.standard_normal(want.shape)
    top.backward(torch.tensor(top_diff))
    np.testing.assert_allclose(
        xt.grad.numpy(), ref_mvn_diff(x, top_diff, **kw).reshape(shape), rtol=1e-10, atol=1e-12
    )


def test_backward_with_large_eps_is_caffes_not_the_exact_derivative():
    layer, (x,) = make_layer("mvn_param { eps: 0.5 }", [(2, 3, 4)], type="MVN", dtype=torch.float64)
    xt = x.clone().requires_grad_(True)
    g = torch.randn(2, 3, 4, 1, dtype=torch.float64)
    (caffe_grad,) = torch.autograd.grad(layer(xt), xt, g)
    rows = xt.reshape(6, 4)
    c = rows - rows.mean(1, keepdim=True)
    exact = c / (torch.sqrt((c * c).mean(1, keepdim=True)) + 0.5)
    (exact_grad,) = torch.autograd.grad(exact.reshape(2, 3, 4, 1), xt, g)
    assert not torch.allclose(caffe_grad, exact_grad, rtol=1e-3)


@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


def test_error_more_than_four_axes():
    with pytest.raises(LayerParamError, match=r"layer 'm1' \(MVN\).*num_axes <= 4"):
        make_layer("", [(2, 3, 2, 2, 2)], type="MVN", name="m1")


def ref_mvn_diff_in_place(x, top_diff, across_channels=False, eps=1e-9):
    """MVNLayer::Backward_cpu (normalize_variance) with bottom_diff aliasing top_diff: each
    step that reads top_diff after the first reads what the previous step wrote there."""
    rows, shape4 = _groups(x, across_channels)
    dim = rows.shape[1]
    y = ref_mvn(x, True, across_channels, eps).reshape(rows.shape)
    d = y * top_diff.reshape(rows.shape)  # caffe_mul(top_data, top_diff, bottom_diff)
    d = np.broadcast_to(d.sum(axis=1, keepdims=True), d.shape)  # gemv, gemm
    d = y * d
    d = d + d.sum(axis=1, keepdims=True)  # gemv of top_diff, which is bottom_diff now
    # axpby(1, X, -1/dim, Y) with X == Y: BVLC's non-MKL cblas_saxpby scales Y, then adds X (= Y)
    d = (-1.0 / dim) * d
    d = d + d
    variance = np.sqrt(((rows - rows.mean(axis=1, keepdims=True)) ** 2).mean(axis=1, keepdims=True))
    return (d / (variance + f32(eps))).reshape(shape4)


@pytest.mark.parametrize("across", [False, True])
def test_in_place_backward_is_caffes_aliased_one(across):
    # Caffe: MVN with top == bottom computes its bottom diff over the top diff it reads
    snippet = f'bottom: "x" top: "x" mvn_param {{ across_channels: {str(across).lower()} }}'
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 4, 5))
    layer, _ = make_layer(snippet, [x.shape], type="MVN", dtype=torch.float64)
    xt = torch.tensor(x, requires_grad=True)
    top = layer(xt)
    np.testing.assert_allclose(top.detach().numpy(), ref_mvn(x, across_channels=across), rtol=1e-12)
    top_diff = rng.standard_normal(x.shape)
    top.backward(torch.tensor(top_diff))
    want = ref_mvn_diff_in_place(x, top_diff, across_channels=across)
    np.testing.assert_allclose(xt.grad.numpy(), want, rtol=1e-10, atol=1e-12)


def test_in_place_backward_matches_real_caffe(tmp_path):
    # Expected values computed by BVLC Caffe 1.0 built from source (CPU, OpenBLAS), pycaffe:
    # MVN with top == bottom, force_backward, x and top diff as below, shape (1, 2, 1, 3)
    path = tmp_path / "mvn.prototxt"
    path.write_text(
        'force_backward: true layer { name: "in" type: "Input" top: "x" '
        "input_param { shape { dim: 1 dim: 2 dim: 1 dim: 3 } } } "
        'layer { name: "m" type: "MVN" bottom: "x" top: "x" }'
    )
    net = caffe.Net(str(path), caffe.TRAIN)
    net.blobs["x"].data[...] = np.array([1, 2, 4, -1, 0.5, 3], np.float32).reshape(1, 2, 1, 3)
    net.forward()
    net.blobs["x"].diff[...] = np.array([0.5, -1, 2, 1, 1, -3], np.float32).reshape(1, 2, 1, 3)
    net.backward()
    caffe_top = [-1.0690452, -0.2672614, 1.3363061, -1.1111678, -0.2020305, 1.3131983]
    caffe_diff = [1.3744872, 0.3436224, -1.7181072, -2.358397, -0.42879945, 2.7871964]
    np.testing.assert_allclose(net.blobs["x"].data.ravel(), caffe_top, rtol=1e-5)
    np.testing.assert_allclose(net.blobs["x"].diff.ravel(), caffe_diff, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_mvn_is_the_float_one_rounded(dtype):
    # a constant slice is 0 / (0 + eps) = 0 in Caffe's float; eps 1e-9 is 0 in float16
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 3, 8, 8, generator=g) * 30 + 200).to(dtype)
    x[0, 1] = 2.0
    layer, _ = make_layer("", [x.shape], type="MVN", bottoms=[x], dtype=dtype)
    ref, _ = make_layer("", [x.shape], type="MVN", bottoms=[x.float()])
    y = layer(x)
    assert y.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(y.float(), ref(x.float()), rtol=tol, atol=tol)
