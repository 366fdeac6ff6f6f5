"""BilinearInterpolate (brocolli): size rules, both coordinate modes, no backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase(
        "BilinearInterpolate", "bilinear_interpolate_param { dst_h: 7 dst_w: 9 }", ((2, 3, 4, 5),)
    ),
    LayerCase(
        "BilinearInterpolate",
        "bilinear_interpolate_param { scale_factor: 2 align_corners: false }",
        ((2, 3, 4, 5),),
    ),
]


def _coords(src, dst, align, dt):
    """The fork's h_temp: per output row, clamped source coordinate, h0, h1 (as Dtype)."""
    rows = []
    for i in range(dst):
        if align:
            x = dt(np.float32(src - 1) / np.float32(dst - 1)) * dt(i)
        else:
            x = dt(float(np.float32(src) / np.float32(dst)) * (float(i) + 0.5) - 0.5)
        x = min(max(x, dt(0)), dt(src - 1))
        h0 = min(max(int(np.floor(x)), 0), src - 2)
        rows.append((x, h0, h0 + 1))
    return rows


def ref_bilinear_interpolate(x, dst_hw, align):
    dt = x.dtype.type
    n, c, sh, sw = x.shape
    out = np.zeros((n, c, *dst_hw), dtype=x.dtype)
    for h, (hx, h0, h1) in enumerate(_coords(sh, dst_hw[0], align, dt)):
        for w, (wx, w0, w1) in enumerate(_coords(sw, dst_hw[1], align, dt)):
            q = {
                (a, b): x[:, :, max(a, 0), max(b, 0)]  # index -1 has weight 0 (1-pixel axis)
                for a in (h0, h1)
                for b in (w0, w1)
            }
            r0 = (dt(w1) - wx) * q[h0, w0] + (wx - dt(w0)) * q[h0, w1]
            r1 = (dt(w1) - wx) * q[h1, w0] + (wx - dt(w0)) * q[h1, w1]
            out[:, :, h, w] = (dt(h1) - hx) * r0 + (hx - dt(h0)) * r1
    return out


@pytest.mark.parametrize(
    "snippet,shape,dst,align",
    [
        ("dst_h: 7 dst_w: 9", (2, 3, 4, 5), (7, 9), True),
        ("dst_h: 7 dst_w: 9 align_corners: false", (2, 3, 4, 5), (7, 9), False),
        ("dst_h: 3 dst_w: 2", (1, 2, 7, 6), (3, 2), True),  # shrinking
        ("dst_h: 3 dst_w: 2 align_corners: false", (1, 2, 7, 6), (3, 2), False),
        ("dst_h: 6", (1, 2, 4, 5), (6, 5), True),  # dst_w missing: input width
        ("scale_factor: 2 align_corners: false", (2, 2, 3, 4), (6, 8), False),
        ("scale_factor: 1.7", (1, 2, 3, 5), (5, 8), True),  # int(3 * 1.7f) = 5
        ("dst_h: 5 dst_w: 4 align_corners: false", (1, 2, 1, 1), (5, 4), False),  # 1x1 input
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_matches_reference(snippet, shape, dst, align, dtype):
    layer, (x,) = make_layer(
        f"bilinear_interpolate_param {{ {snippet} }}",
        [shape],
        type="BilinearInterpolate",
        dtype=dtype,
    )
    top = layer(x)
    want = ref_bilinear_interpolate(x.numpy(), dst, align)
    assert layer.output_shapes([shape]) == [want.shape]
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    np.testing.assert_allclose(top.numpy(), want, rtol=tol, atol=tol)
    # the fork's notes: this is torch's bilinear mode at that size and align_corners
    torch_ref = F.interpolate(x, size=dst, mode="bilinear", align_corners=align)
    np.testing.assert_allclose(top.numpy(), torch_ref.numpy(), rtol=1e-5, atol=1e-5)


def test_size_fixed_at_setup():
    layer, _ = make_layer(
        "bilinear_interpolate_param { scale_factor: 2 }", [(1, 2, 3, 4)], type="BilinearInterpolate"
    )
    assert layer(torch.randn(1, 2, 5, 5)).shape == (1, 2, 6, 8)


def test_no_backward():
    layer, (x,) = make_layer(
        "bilinear_interpolate_param { dst_h: 5 dst_w: 6 }",
        [(1, 2, 3, 4)],
        type="BilinearInterpolate",
    )
    assert not layer.has_backward
    assert not layer(x.requires_grad_(True)).requires_grad


@pytest.mark.parametrize(
    "snippet,shape,field",
    [
        ("", (2, 3, 4, 5), "neither"),
        ("bilinear_interpolate_param { dst_h: 5 scale_factor: 2 }", (2, 3, 4, 5), "both"),
        ("bilinear_interpolate_param { dst_h: 0 dst_w: 3 }", (2, 3, 4, 5), "positive"),
        ("bilinear_interpolate_param { scale_factor: 0.1 }", (2, 3, 4, 5), "positive"),
        ("bilinear_interpolate_param { dst_h: 1 dst_w: 3 }", (2, 3, 4, 5), "align_corners"),
        ("bilinear_interpolate_param { dst_h: 4 dst_w: 3 }", (2, 3, 4), "4 axes"),
    ],
)
def test_error(snippet, shape, field):
    with pytest.raises(LayerParamError, match=rf"layer 'b1' \(BilinearInterpolate\).*{field}"):
        make_layer(snippet, [shape], type="BilinearInterpolate", name="b1")
