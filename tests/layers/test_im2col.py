"""Im2col: Caffe's channel-major column layout for 1-d to 4-d geometry, axis, and checks."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Im2col", "convolution_param { kernel_size: 3 pad: 1 stride: 2 }", ((2, 3, 5, 6),)),
    LayerCase(
        "Im2col",
        "convolution_param { kernel_h: 2 kernel_w: 3 dilation: 2 stride_h: 1 stride_w: 2 }",
        ((2, 3, 6, 7),),
        id="rect_dilation",
    ),
    LayerCase(
        "Im2col",
        "convolution_param { kernel_size: 2 stride: 2 stride: 1 stride: 1 pad: 1 }",
        ((2, 3, 4, 5, 3),),
        id="im2col_3d",
    ),
]


def ref_im2col(x, kernel, stride, pad, dilation):
    """Caffe's im2col_nd: column row c * prod(kernel) + (kernel offset, row-major) at output
    position q holds x[c, q * stride - pad + k * dilation], zero outside the bottom."""
    chans, spatial = x.shape[0], x.shape[1:]
    out = [
        int((i + 2 * p - (d * (k - 1) + 1)) / s) + 1
        for i, k, s, p, d in zip(spatial, kernel, stride, pad, dilation)
    ]
    cols = np.zeros((chans * math.prod(kernel), *out))
    for c in range(chans):
        for r, koff in enumerate(itertools.product(*[range(k) for k in kernel])):
            for q in itertools.product(*[range(o) for o in out]):
                src = [qi * s - p + k * d for qi, s, p, k, d in zip(q, stride, pad, koff, dilation)]
                if all(0 <= v < i for v, i in zip(src, spatial)):
                    cols[(c * math.prod(kernel) + r, *q)] = x[(c, *src)]
    return cols


@pytest.mark.parametrize(
    "snippet,shape,kernel,stride,pad,dilation",
    [
        (CASES[0].snippet, (2, 3, 5, 6), (3, 3), (2, 2), (1, 1), (1, 1)),
        (CASES[1].snippet, (2, 3, 6, 7), (2, 3), (1, 2), (0, 0), (2, 2)),
        (CASES[2].snippet, (2, 3, 4, 5, 3), (2, 2, 2), (2, 1, 1), (1, 1, 1), (1, 1, 1)),
        (
            "convolution_param { kernel_size: 3 stride: 2 pad: 2 }",
            (2, 3, 7),
            (3,),
            (2,),
            (2,),
            (1,),
        ),
        (
            "convolution_param { kernel_size: 2 pad: 1 pad: 0 pad: 0 pad: 1 }",
            (1, 2, 2, 3, 2, 3),
            (2,) * 4,
            (1,) * 4,
            (1, 0, 0, 1),
            (1,) * 4,
        ),
        # (3 + 0 - 4) / 2 truncates to 0 in C: one column that reads zeros past the end
        (
            "convolution_param { kernel_size: 4 stride: 2 }",
            (2, 3, 3, 5),
            (4, 4),
            (2, 2),
            (0, 0),
            (1, 1),
        ),
    ],
)
def test_forward_matches_caffe_layout(snippet, shape, kernel, stride, pad, dilation):
    layer, (x,) = make_layer(snippet, [shape], type="Im2col", dtype=torch.float64)
    top = layer(x).numpy()
    want = np.stack([ref_im2col(xi, kernel, stride, pad, dilation) for xi in x.numpy()])
    np.testing.assert_array_equal(top, want)


def test_forward_axis_keeps_leading_axes():
    layer, (x,) = make_layer(
        "convolution_param { kernel_size: 2 axis: 2 }",
        [(2, 3, 4, 5, 6)],
        type="Im2col",
        dtype=torch.float64,
    )
    top = layer(x).numpy()
    assert top.shape == (2, 3, 16, 4, 5)
    want = ref_im2col(x.numpy()[1, 2], (2, 2), (1, 1), (0, 0), (1, 1))
    np.testing.assert_array_equal(top[1, 2], want)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, max_points=50)


@pytest.mark.parametrize(
    "snippet,shape,field",
    [
        ("kernel_size: 2 axis: -1", (2, 3, 4), "spatial axes"),
        ("kernel_size: 2 kernel_size: 2 kernel_size: 2", (2, 3, 4, 5), "kernel_size"),
        ("kernel_h: 2 kernel_w: 2", (2, 3, 4), "kernel_h"),
        ("kernel_size: 2 stride_h: 2", (2, 3, 4, 5), "stride"),
        ("kernel_size: 7", (2, 3, 4, 5), "output size"),
    ],
)
def test_error(snippet, shape, field):
    with pytest.raises(LayerParamError, match=rf"layer 'i1' \(Im2col\).*{field}"):
        make_layer(f"convolution_param {{ {snippet} }}", [shape], type="Im2col", name="i1")
