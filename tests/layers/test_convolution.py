"""Convolution: N-d geometry (repeated and _h/_w fields), groups, dilation, axis, several
bottoms, C's truncating output size, blob shapes and fillers, Caffe's checks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError, LayerParamError

FILL = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 }'

CASES = [
    LayerCase(
        "Convolution",
        f"convolution_param {{ num_output: 4 kernel_h: 3 kernel_w: 2 pad_h: 1 "
        f"stride_h: 2 stride_w: 1 {FILL} }}",
        ((2, 3, 7, 6),),
    ),
    LayerCase(
        "Convolution",
        f"convolution_param {{ num_output: 4 group: 2 kernel_size: 3 "
        f"dilation: 2 pad: 2 bias_term: false {FILL} }}",
        ((2, 6, 7, 8),),
    ),
    LayerCase(
        "Convolution",
        f"convolution_param {{ num_output: 2 kernel_size: 2 kernel_size: 3 "
        f"kernel_size: 1 stride: 2 stride: 1 stride: 1 pad: 1 {FILL} }}",
        ((2, 3, 4, 5, 6),),
        id="conv_3d",
    ),
    LayerCase(
        "Convolution",
        f"convolution_param {{ num_output: 2 kernel_size: 1 {FILL} }}",
        ((2, 3, 4, 5), (2, 3, 4, 5)),
        n_tops=2,
        id="two_bottoms",
    ),
]


def ref_conv(x, w, b, stride, pad, dilation, group):
    """top[n, o, q] = b[o] + sum over c in o's group and kernel offsets k of
    w[o, c, k] * x[n, c, q * stride - pad + k * dilation] (zero outside the bottom); the output
    size is (in + 2 pad - extent) / stride + 1 with C's truncating division."""
    n, chans, spatial = x.shape[0], x.shape[1], x.shape[2:]
    n_out, kernel = w.shape[0], w.shape[2:]
    out = [
        int((i + 2 * p - (d * (k - 1) + 1)) / s) + 1
        for i, k, s, p, d in zip(spatial, kernel, stride, pad, dilation)
    ]
    y = np.zeros((n, n_out, *out))
    og, cg = n_out // group, chans // group
    for koff in itertools.product(*[range(k) for k in kernel]):
        pos = [
            np.arange(o) * s - p + k * d for o, s, p, d, k in zip(out, stride, pad, dilation, koff)
        ]
        valid = [(q >= 0) & (q < i) for q, i in zip(pos, spatial)]
        grid = np.ix_(*[np.where(v, q, 0) for q, v in zip(pos, valid)])
        taken = x[(slice(None), slice(None)) + grid]
        mask = np.ones(out, dtype=bool)
        for a, v in enumerate(valid):
            mask = mask & v.reshape([-1 if j == a else 1 for j in range(len(out))])
        taken = taken * mask
        for g in range(group):
            wk = w[(slice(g * og, (g + 1) * og), slice(None)) + koff]
            y[:, g * og : (g + 1) * og] += np.einsum(
                "oc,nc...->no...", wk, taken[:, g * cg : (g + 1) * cg]
            )
    if b is not None:
        y += b.reshape(1, -1, *[1] * len(out))
    return y


def _check(snippet, shape, *, stride, pad, dilation, group, axis=1, n_bottoms=1):
    layer, bottoms = make_layer(
        snippet, [shape] * n_bottoms, type="Convolution", n_tops=n_bottoms, dtype=torch.float64
    )
    tops = layer(*bottoms)
    tops = tops if isinstance(tops, tuple) else (tops,)
    w = layer.weight.detach().numpy()
    b = layer.bias.detach().numpy() if layer.bias_term else None
    for x, top in zip(bottoms, tops):
        xs = x.numpy()
        lead = xs.shape[:axis]
        xs = xs.reshape(-1, *xs.shape[axis:])
        want = ref_conv(xs, w, b, stride, pad, dilation, group)
        want = want.reshape(*lead, *want.shape[1:])
        np.testing.assert_allclose(top.detach().numpy(), want, rtol=1e-10, atol=1e-12)
    return layer, tops


def test_forward_rect_kernel_hw_fields():
    layer, (top,) = _check(
        CASES[0].snippet, (2, 3, 7, 6), stride=(2, 1), pad=(1, 0), dilation=(1, 1), group=1
    )
    assert top.shape == (2, 4, 4, 5)
    assert tuple(layer.weight.shape) == (4, 3, 3, 2) and tuple(layer.bias.shape) == (4,)


def test_forward_group_dilation_nobias():
    layer, _ = _check(
        CASES[1].snippet, (2, 6, 7, 8), stride=(1, 1), pad=(2, 2), dilation=(2, 2), group=2
    )
    assert tuple(layer.weight.shape) == (4, 3, 3, 3) and layer.param_blobs()[1:] == []


def test_forward_3d_per_axis_fields():
    _check(
        CASES[2].snippet,
        (2, 3, 4, 5, 6),
        stride=(2, 1, 1),
        pad=(1, 1, 1),
        dilation=(1,) * 3,
        group=1,
    )


def test_forward_1d_and_4d_spatial():
    _check(
        f"convolution_param {{ num_output: 3 kernel_size: 3 stride: 2 pad: 1 {FILL} }}",
        (2, 4, 9),
        stride=(2,),
        pad=(1,),
        dilation=(1,),
        group=1,
    )
    _check(
        f"convolution_param {{ num_output: 4 group: 2 kernel_size: 2 pad: 1 pad: 0 pad: 1 "
        f"pad: 0 stride: 2 stride: 1 stride: 1 stride: 2 dilation: 1 dilation: 2 dilation: 1 "
        f"dilation: 1 {FILL} }}",
        (2, 4, 3, 4, 5, 6),
        stride=(2, 1, 1, 2),
        pad=(1, 0, 1, 0),
        dilation=(1, 2, 1, 1),
        group=2,
    )


def test_forward_axis_leading_dims_and_no_spatial_axes():
    _check(
        f"convolution_param {{ num_output: 3 axis: 2 kernel_size: 2 {FILL} }}",
        (2, 3, 4, 5, 6),
        stride=(1, 1),
        pad=(0, 0),
        dilation=(1, 1),
        group=1,
        axis=2,
    )
    layer, (top,) = _check(
        f"convolution_param {{ num_output: 4 group: 2 axis: -1 {FILL} }}",
        (3, 5, 6),
        stride=(),
        pad=(),
        dilation=(),
        group=2,
        axis=2,
    )
    assert top.shape == (3, 5, 4) and tuple(layer.weight.shape) == (4, 3)


def test_forward_truncating_division_reads_zeros_past_the_end():
    # (2 + 0 - 3) / 2 truncates to 0 in C: one output whose window runs past the bottom
    _, (top,) = _check(
        f"convolution_param {{ num_output: 2 kernel_size: 3 stride: 2 {FILL} }}",
        (2, 3, 2, 4),
        stride=(2, 2),
        pad=(0, 0),
        dilation=(1, 1),
        group=1,
    )
    assert top.shape == (2, 2, 1, 1)


def test_forward_two_bottoms_share_filters():
    _check(
        CASES[3].snippet,
        (2, 3, 4, 5),
        stride=(1, 1),
        pad=(0, 0),
        dilation=(1, 1),
        group=1,
        n_bottoms=2,
    )


def test_default_fillers_are_zero_constant():
    layer, (x,) = make_layer(
        "convolution_param { num_output: 2 kernel_size: 3 }", [(2, 3, 4, 5)], type="Convolution"
    )
    assert not layer.weight.any() and not layer.bias.any()


@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, max_points=50)


def test_gradient_4d_spatial_and_no_spatial():
    layer, bottoms = make_layer(
        f"convolution_param {{ num_output: 2 group: 2 kernel_size: 2 pad: 1 stride: 2 {FILL} }}",
        [(1, 2, 2, 3, 2, 3)],
        type="Convolution",
    )
    check_layer_gradient(layer, bottoms, max_points=50)
    layer, bottoms = make_layer(
        f"convolution_param {{ num_output: 3 axis: 1 {FILL} }}", [(2, 4)], type="Convolution"
    )
    check_layer_gradient(layer, bottoms, max_points=50)


@pytest.mark.parametrize(
    "snippet,shape,field",
    [
        ("num_output: 2", (2, 3, 4, 5), "kernel_size"),
        ("num_output: 2 kernel_size: 2 kernel_size: 2 kernel_size: 2", (2, 3, 4, 5), "kernel_size"),
        ("num_output: 2 kernel_size: 2 kernel_h: 2 kernel_w: 2", (2, 3, 4, 5), "kernel_size"),
        ("num_output: 2 kernel_h: 2 kernel_w: 2", (2, 3, 4, 5, 6), "kernel_h"),
        ("num_output: 2 kernel_h: 2", (2, 3, 4, 5), "filter dimensions"),
        ("num_output: 2 kernel_size: 0", (2, 3, 4, 5), "filter dimensions"),
        ("num_output: 2 kernel_size: 2 stride: 0", (2, 3, 4, 5), "stride"),
        ("num_output: 2 kernel_size: 2 stride: 1 stride_h: 1 stride_w: 1", (2, 3, 4, 5), "stride"),
        ("num_output: 2 kernel_size: 2 pad: 1 pad: 1 pad: 1", (2, 3, 4, 5), "pad"),
        (
            "num_output: 2 kernel_size: 2 dilation: 1 dilation: 1 dilation: 1",
            (2, 3, 4, 5),
            "dilation",
        ),
        ("kernel_size: 2", (2, 3, 4, 5), "num_output"),
        ("num_output: 2 group: 2 kernel_size: 2", (2, 3, 4, 5), "group"),
        ("num_output: 4 group: 3 kernel_size: 2", (2, 6, 4, 5), "num_output"),
        ("num_output: 2 kernel_size: 2 axis: 4", (2, 3, 4, 5), "axis"),
        ("num_output: 2 kernel_size: 5 stride: 1", (2, 3, 4, 5), "output size"),
    ],
)
def test_error(snippet, shape, field):
    with pytest.raises(LayerParamError, match=rf"layer 'c1' \(Convolution\).*{field}"):
        make_layer(f"convolution_param {{ {snippet} }}", [shape], type="Convolution", name="c1")


def test_error_bottoms_must_share_shape_and_match_tops():
    with pytest.raises(LayerParamError, match=r"layer 'c1' \(Convolution\).*same shape"):
        make_layer(
            "convolution_param { num_output: 2 kernel_size: 1 }",
            [(2, 3, 4, 5), (2, 3, 4, 6)],
            type="Convolution",
            n_tops=2,
            name="c1",
        )
    with pytest.raises(BlobWiringError, match=r"layer 'c1' \(Convolution\).*top"):
        make_layer(
            "convolution_param { num_output: 2 kernel_size: 1 }",
            [(2, 3, 4, 5), (2, 3, 4, 5)],
            type="Convolution",
            n_tops=1,
            name="c1",
        )
    layer, _ = make_layer(
        "convolution_param { num_output: 2 kernel_size: 1 }",
        [(2, 3, 4, 5)],
        type="Convolution",
        name="c1",
    )
    # checked once per input shape (the net's infer_shapes), not inside forward
    with pytest.raises(LayerParamError, match=r"layer 'c1' \(Convolution\).*channels"):
        layer.output_shapes([(2, 4, 4, 5)])
