"""Interp (PSPNet/DeepLab): output-size rules, cropping, caffe_cpu_interp2 forward and backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError, LayerParamError

CASES = [
    LayerCase("Interp", "interp_param { height: 7 width: 9 }", ((2, 3, 4, 5),)),
    LayerCase("Interp", "interp_param { zoom_factor: 2 }", ((2, 3, 4, 5),)),
    LayerCase(
        "Interp", "interp_param { shrink_factor: 2 pad_beg: -1 pad_end: -1 }", ((2, 3, 7, 6),)
    ),
    LayerCase("Interp", "interp_param { use_blob_size: true }", ((2, 3, 4, 5), (1, 1, 6, 3))),
]


def _lambdas(n_in, n_out):
    """The fork's float coordinate maths: h1, h1p, h1lambda (float), one per output row."""
    r = np.float32(n_in - 1) / np.float32(n_out - 1) if n_out > 1 else np.float32(0)
    rows = []
    for j in range(n_out):
        x = np.float32(r * np.float32(j))
        i = int(x)
        rows.append((i, 1 if i < n_in - 1 else 0, np.float32(x - np.float32(i))))
    return rows


def ref_interp2(x, out_hw, crop=(0, 0)):
    """caffe_cpu_interp2<Dtype, false> over N*C channels, reading the crop [b : b + eff)."""
    n, c = x.shape[:2]
    b, e = crop
    src = x[:, :, b : x.shape[2] - e, b : x.shape[3] - e].reshape(n * c, -1, x.shape[3] - b - e)
    h1_, w1_ = src.shape[1:]
    h2_, w2_ = out_hw
    out = np.zeros((n * c, h2_, w2_), dtype=x.dtype)
    if (h1_, w1_) == (h2_, w2_):
        return src.reshape(n, c, h2_, w2_).copy()
    one = x.dtype.type(1)
    for h2, (h1, h1p, hl1) in enumerate(_lambdas(h1_, h2_)):
        hl1 = x.dtype.type(hl1)
        for w2, (w1, w1p, wl1) in enumerate(_lambdas(w1_, w2_)):
            wl1 = x.dtype.type(wl1)
            hl0, wl0 = one - hl1, one - wl1
            p = src[:, h1:, w1:]
            out[:, h2, w2] = hl0 * (wl0 * p[:, 0, 0] + wl1 * p[:, 0, w1p]) + hl1 * (
                wl0 * p[:, h1p, 0] + wl1 * p[:, h1p, w1p]
            )
    return out.reshape(n, c, h2_, w2_)


def ref_interp2_backward(top_diff, in_shape, crop=(0, 0)):
    """caffe_cpu_interp2_backward: bottom diff zeroed, then each top diff scattered."""
    n, c, hin, win = in_shape
    b, e = crop
    diff = np.zeros((n * c, hin, win), dtype=top_diff.dtype)
    h1_, w1_ = hin - b - e, win - b - e
    h2_, w2_ = top_diff.shape[2:]
    g = top_diff.reshape(n * c, h2_, w2_)
    if (h1_, w1_) == (h2_, w2_):
        diff[:, b : b + h1_, b : b + w1_] += g
        return diff.reshape(in_shape)
    one = top_diff.dtype.type(1)
    for h2, (h1, h1p, hl1) in enumerate(_lambdas(h1_, h2_)):
        hl1 = top_diff.dtype.type(hl1)
        for w2, (w1, w1p, wl1) in enumerate(_lambdas(w1_, w2_)):
            wl1 = top_diff.dtype.type(wl1)
            hl0, wl0 = one - hl1, one - wl1
            t = g[:, h2, w2]
            diff[:, b + h1, b + w1] += hl0 * wl0 * t
            diff[:, b + h1, b + w1 + w1p] += hl0 * wl1 * t
            diff[:, b + h1 + h1p, b + w1] += hl1 * wl0 * t
            diff[:, b + h1 + h1p, b + w1 + w1p] += hl1 * wl1 * t
    return diff.reshape(in_shape)


@pytest.mark.parametrize(
    "snippet,shape,out_hw,crop",
    [
        ("interp_param { height: 7 width: 9 }", (2, 3, 4, 5), (7, 9), (0, 0)),
        ("interp_param { height: 3 width: 2 }", (2, 3, 7, 6), (3, 2), (0, 0)),  # shrinking
        ("interp_param { height: 1 width: 5 }", (1, 2, 4, 3), (1, 5), (0, 0)),  # rheight = 0
        ("interp_param { height: 6 width: 1 }", (1, 2, 1, 3), (6, 1), (0, 0)),  # 1-row input
        ("interp_param { zoom_factor: 3 }", (2, 3, 4, 5), (10, 13), (0, 0)),
        ("interp_param { shrink_factor: 2 }", (2, 3, 7, 6), (4, 3), (0, 0)),
        ("interp_param { shrink_factor: 3 zoom_factor: 2 }", (1, 2, 7, 9), (5, 5), (0, 0)),
        ("interp_param { zoom_factor: 2 pad_beg: -1 pad_end: -2 }", (1, 2, 8, 7), (9, 7), (1, 2)),
        (
            "interp_param { height: 5 width: 4 pad_beg: -1 pad_end: -1 }",
            (1, 2, 7, 6),
            (5, 4),
            (1, 1),
        ),  # same-size after cropping: the copy case
        ("interp_param { height: 61 width: 473 }", (1, 2, 60, 60), (61, 473), (0, 0)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_backward_match_reference(snippet, shape, out_hw, crop, dtype):
    layer, (x,) = make_layer(snippet, [shape], type="Interp", dtype=dtype)
    x = x.requires_grad_(True)
    top = layer(x)
    xn = x.detach().numpy()
    want = ref_interp2(xn, out_hw, crop)
    assert layer.output_shapes([shape]) == [want.shape]
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    np.testing.assert_allclose(top.detach().numpy(), want, rtol=tol, atol=tol)
    top_diff = np.random.default_rng(0).standard_normal(want.shape).astype(xn.dtype)
    top.backward(torch.from_numpy(top_diff))
    np.testing.assert_allclose(
        x.grad.numpy(), ref_interp2_backward(top_diff, shape, crop), rtol=tol, atol=tol
    )


def test_use_blob_size_takes_bottom1_size():
    layer, (x, ref) = make_layer(
        "interp_param { use_blob_size: true }", [(2, 3, 4, 5), (1, 7, 6, 3)], type="Interp"
    )
    top = layer(x, ref)
    np.testing.assert_allclose(top.numpy(), ref_interp2(x.numpy(), (6, 3)), rtol=1e-6)


def test_nan_stays_with_its_neighbours():
    x = torch.zeros(1, 1, 4, 4)
    x[0, 0, 0, 0] = float("nan")
    layer, _ = make_layer("interp_param { zoom_factor: 2 }", [(1, 1, 4, 4)], type="Interp")
    top = layer(x)
    assert torch.isnan(top[0, 0, :2, :2]).all() and not torch.isnan(top[0, 0, 2:, :]).any()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0])


@pytest.mark.parametrize(
    "snippet,shapes,field",
    [
        ("", [(2, 3, 4, 5)], "output size is not specified"),
        ("interp_param { height: 4 }", [(2, 3, 4, 5)], "output size is not specified"),
        ("interp_param { zoom_factor: 0 }", [(2, 3, 4, 5)], "zoom_factor"),
        ("interp_param { shrink_factor: -1 }", [(2, 3, 4, 5)], "shrink_factor"),
        ("interp_param { zoom_factor: 2 pad_beg: 1 }", [(2, 3, 4, 5)], "pad_beg"),
        ("interp_param { zoom_factor: 2 pad_end: -4 }", [(2, 3, 4, 5)], "cropped input"),
        ("interp_param { height: 0 width: 3 }", [(2, 3, 4, 5)], "output size must be positive"),
        ("interp_param { zoom_factor: 2 }", [(2, 3, 4)], "4 axes"),
        ("interp_param { use_blob_size: true }", [(2, 3, 4, 5)], "use_blob_size"),
        ("interp_param { zoom_factor: 2 }", [(2, 3, 4, 5), (2, 3, 4, 5)], "use_blob_size"),
    ],
)
def test_error(snippet, shapes, field):
    with pytest.raises(LayerParamError, match=rf"layer 'i1' \(Interp\).*{field}"):
        make_layer(snippet, shapes, type="Interp", name="i1")


def test_error_three_bottoms():
    with pytest.raises(BlobWiringError, match=r"layer 'i1' \(Interp\).*bottom"):
        make_layer(
            "interp_param { use_blob_size: true }", [(1, 1, 2, 2)] * 3, type="Interp", name="i1"
        )
