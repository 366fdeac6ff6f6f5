"""Deconvolution: output size stride * (in - 1) + extent - 2 * pad, the (C_in, C_out / group, k)
weight blob, groups, dilation, N-d geometry, and Caffe's checks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

FILL = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 }'

CASES = [
    LayerCase(
        "Deconvolution",
        f"convolution_param {{ num_output: 2 kernel_size: 4 stride: 2 pad: 1 {FILL} }}",
        ((2, 3, 4, 5),),
    ),
    LayerCase(
        "Deconvolution",
        f"convolution_param {{ num_output: 4 group: 2 kernel_h: 3 "
        f"kernel_w: 2 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 0 bias_term: false {FILL} }}",
        ((2, 6, 3, 5),),
        id="group_rect",
    ),
    LayerCase(
        "Deconvolution",
        f"convolution_param {{ num_output: 2 kernel_size: 3 stride: 2 dilation: 2 pad: 1 {FILL} }}",
        ((2, 3, 3, 4, 5),),
        id="deconv_3d_dilated",
    ),
]


def ref_deconv(x, w, b, stride, pad, dilation, group):
    """Each input position q scatters w[c, o, k] * x[n, c, q] to output position
    q * stride + k * dilation - pad (dropped outside [0, out)); out = stride * (in - 1) +
    extent - 2 * pad."""
    n, chans, spatial = x.shape[0], x.shape[1], x.shape[2:]
    og, kernel = w.shape[1], w.shape[2:]
    cg = chans // group
    full = [s * (i - 1) + d * (k - 1) + 1 for i, s, d, k in zip(spatial, stride, dilation, kernel)]
    acc = np.zeros((n, og * group, *full))
    for koff in itertools.product(*[range(k) for k in kernel]):
        place = tuple(
            slice(k * d, k * d + s * (i - 1) + 1, s)
            for k, d, s, i in zip(koff, dilation, stride, spatial)
        )
        for g in range(group):
            wk = w[(slice(g * cg, (g + 1) * cg), slice(None)) + koff]
            acc[(slice(None), slice(g * og, (g + 1) * og)) + place] += np.einsum(
                "co,nc...->no...", wk, x[:, g * cg : (g + 1) * cg]
            )
    crop = tuple(slice(p, f - p) for p, f in zip(pad, full))
    y = acc[(slice(None), slice(None)) + crop]
    if b is not None:
        y = y + b.reshape(1, -1, *[1] * len(spatial))
    return y


def _check(snippet, shape, *, stride, pad, dilation, group):
    layer, (x,) = make_layer(snippet, [shape], type="Deconvolution", dtype=torch.float64)
    top = layer(x)
    b = layer.bias.detach().numpy() if layer.bias_term else None
    want = ref_deconv(x.numpy(), layer.weight.detach().numpy(), b, stride, pad, dilation, group)
    np.testing.assert_allclose(top.detach().numpy(), want, rtol=1e-10, atol=1e-12)
    return layer, top


def test_forward_stride2_pad():
    layer, top = _check(
        CASES[0].snippet, (2, 3, 4, 5), stride=(2, 2), pad=(1, 1), dilation=(1, 1), group=1
    )
    assert top.shape == (2, 2, 8, 10)  # 2 * (in - 1) + 4 - 2
    assert tuple(layer.weight.shape) == (3, 2, 4, 4)


def test_forward_group_rect_weight_is_cin_by_cout_per_group():
    layer, top = _check(
        CASES[1].snippet, (2, 6, 3, 5), stride=(1, 2), pad=(1, 0), dilation=(1, 1), group=2
    )
    assert tuple(layer.weight.shape) == (6, 2, 3, 2) and top.shape == (2, 4, 3, 10)


def test_forward_3d_dilated_and_4d_spatial():
    _check(
        CASES[2].snippet, (2, 3, 3, 4, 5), stride=(2,) * 3, pad=(1,) * 3, dilation=(2,) * 3, group=1
    )
    _check(
        f"convolution_param {{ num_output: 4 group: 2 kernel_size: 2 kernel_size: 3 "
        f"kernel_size: 1 kernel_size: 2 stride: 2 stride: 1 stride: 3 stride: 1 pad: 1 pad: 0 "
        f"pad: 0 pad: 1 dilation: 1 dilation: 2 dilation: 1 dilation: 1 {FILL} }}",
        (2, 2, 3, 2, 4, 5),
        stride=(2, 1, 3, 1),
        pad=(1, 0, 0, 1),
        dilation=(1, 2, 1, 1),
        group=2,
    )


def test_forward_axis_and_no_spatial_axes():
    layer, (x,) = make_layer(
        f"convolution_param {{ num_output: 4 group: 2 axis: -1 {FILL} }}",
        [(3, 5, 6)],
        type="Deconvolution",
        dtype=torch.float64,
    )
    w, b = layer.weight.detach().numpy(), layer.bias.detach().numpy()
    assert w.shape == (6, 2)
    xs = x.numpy()
    want = np.concatenate([xs[..., :3] @ w[:3], xs[..., 3:] @ w[3:]], axis=-1) + b
    np.testing.assert_allclose(layer(x).detach().numpy(), want, rtol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, max_points=150)


def test_gradient_4d_spatial():
    layer, bottoms = make_layer(
        f"convolution_param {{ num_output: 2 group: 2 kernel_size: 2 stride: 2 pad: 1 {FILL} }}",
        [(1, 2, 2, 3, 2, 2)],
        type="Deconvolution",
    )
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,field",
    [
        ("num_output: 2", "kernel_size"),
        ("num_output: 2 kernel_size: 2 stride: 0", "stride"),
        ("num_output: 3 group: 3 kernel_size: 2", "group"),
        ("num_output: 2 kernel_size: 1 pad: 1", "output size"),
    ],
)
def test_error(snippet, field):
    with pytest.raises(LayerParamError, match=rf"layer 'd1' \(Deconvolution\).*{field}"):
        make_layer(
            f"convolution_param {{ {snippet} }}", [(2, 4, 1, 5)], type="Deconvolution", name="d1"
        )
