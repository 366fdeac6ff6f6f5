"""Resize (brocolli): util_img BiLinearResizeMat coordinates, dropped border weights, backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Resize", "resize_param { height: 7 width: 8 }", ((2, 3, 4, 5),)),
    LayerCase("Resize", "resize_param { height: 3 width: 2 }", ((2, 3, 6, 5),)),
    LayerCase(
        "Resize",
        "resize_param { is_pyramid_test: true out_height_scale: 1.5 out_width_scale: 0.75 }",
        ((2, 2, 6, 4),),
    ),
]


def _rules(src_h, src_w, dst_h, dst_w, dt):
    """GetBiLinearResizeMatRules_cpu: up to four (flat source index, weight) per output pixel."""
    scale_w, scale_h = dt(src_w) / dt(dst_w), dt(src_h) / dt(dst_h)
    rules = []
    for i in range(dst_h * dst_w):
        fh = dt(i // dst_w) * scale_h
        sh = int(np.floor(fh))
        fh = dt(fh - dt(sh))
        fw = dt(i % dst_w) * scale_w
        sw = int(np.floor(fw))
        fw = dt(fw - dt(sw))
        wh0, wh1, ww0, ww1 = abs(dt(1) - fh), abs(fh), abs(dt(1) - fw), abs(fw)
        idx = sh * src_w + sw
        taps = [(idx, wh0 * ww0)]
        if sw + 1 < src_w:
            taps.append((idx + 1, wh0 * ww1))
        if sh + 1 < src_h:
            taps.append((idx + src_w, wh1 * ww0))
        if sw + 1 < src_w and sh + 1 < src_h:
            taps.append((idx + src_w + 1, wh1 * ww1))
        rules.append(taps)
    return rules


def ref_resize(x, out_hw):
    n, c, h, w = x.shape
    src = x.reshape(n * c, h * w)
    rules = _rules(h, w, *out_hw, x.dtype.type)
    out = np.stack([sum(wt * src[:, j] for j, wt in taps) for taps in rules], axis=1)
    return out.reshape(n, c, *out_hw)


def ref_resize_backward(top_diff, in_shape):
    n, c, h, w = in_shape
    g = top_diff.reshape(n * c, -1)
    diff = np.zeros((n * c, h * w), dtype=top_diff.dtype)
    for i, taps in enumerate(_rules(h, w, *top_diff.shape[2:], top_diff.dtype.type)):
        for j, wt in taps:
            diff[:, j] += g[:, i] * wt
    return diff.reshape(in_shape)


@pytest.mark.parametrize(
    "snippet,shape,out_hw",
    [
        ("resize_param { height: 7 width: 8 }", (2, 3, 4, 5), (7, 8)),
        ("resize_param { height: 3 width: 2 }", (2, 3, 6, 5), (3, 2)),
        ("resize_param { height: 4 width: 5 }", (1, 2, 4, 5), (4, 5)),  # same size: identity
        ("resize_param { height: 5 width: 3 }", (1, 2, 1, 1), (5, 3)),  # 1x1 input
        (
            "resize_param { is_pyramid_test: true out_height_scale: 1.5 out_width_scale: 0.75 }",
            (2, 2, 6, 4),
            (9, 3),
        ),
        (
            "resize_param { is_pyramid_test: true out_height_scale: 2.5 out_width_scale: 3 }",
            (1, 2, 3, 5),
            (7, 15),
        ),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_backward_match_reference(snippet, shape, out_hw, dtype):
    layer, (x,) = make_layer(snippet, [shape], type="Resize", dtype=dtype)
    x = x.requires_grad_(True)
    top = layer(x)
    xn = x.detach().numpy()
    want = ref_resize(xn, out_hw)
    assert layer.output_shapes([shape]) == [want.shape]
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    np.testing.assert_allclose(top.detach().numpy(), want, rtol=tol, atol=tol)
    top_diff = np.random.default_rng(0).standard_normal(want.shape).astype(xn.dtype)
    top.backward(torch.from_numpy(top_diff))
    np.testing.assert_allclose(
        x.grad.numpy(), ref_resize_backward(top_diff, shape), rtol=tol, atol=tol
    )


def test_pyramid_size_follows_the_bottom():
    layer, _ = make_layer(
        "resize_param { is_pyramid_test: true out_height_scale: 0.5 out_width_scale: 2 }",
        [(1, 2, 6, 4)],
        type="Resize",
    )
    assert layer.output_shapes([(1, 2, 9, 3)]) == [(1, 2, 4, 6)]
    assert layer(torch.randn(1, 2, 9, 3)).shape == (1, 2, 4, 6)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,shape,field",
    [
        ("", (2, 3, 4, 5), "height"),
        ("resize_param { height: 4 }", (2, 3, 4, 5), "width"),
        (
            "resize_param { is_pyramid_test: true out_height_scale: 2 }",
            (2, 3, 4, 5),
            "out_width_scale",
        ),
        ("resize_param { height: 0 width: 3 }", (2, 3, 4, 5), "output size"),
        (
            "resize_param { is_pyramid_test: true out_height_scale: 0.1 out_width_scale: 1 }",
            (2, 3, 4, 5),
            "output size",
        ),
        ("resize_param { height: 4 width: 3 }", (2, 3, 4), "4 axes"),
    ],
)
def test_error(snippet, shape, field):
    with pytest.raises(LayerParamError, match=rf"layer 'r1' \(Resize\).*{field}"):
        make_layer(snippet, [shape], type="Resize", name="r1")
