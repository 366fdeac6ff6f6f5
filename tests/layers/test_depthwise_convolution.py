"""The MobileNet forks' depthwise types: ConvolutionDepthwise (one (1, kh, kw) filter per
channel, num_output/group ignored, the fork's geometry reading) and DepthwiseConvolution
(exactly Convolution)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from tests.layers.test_convolution import FILL, ref_conv
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase(
        "ConvolutionDepthwise",
        f"convolution_param {{ num_output: 4 group: 4 kernel_size: 3 pad: 1 stride: 2 {FILL} }}",
        ((2, 4, 7, 6),),
    ),
    LayerCase(
        "DepthwiseConvolution",
        f"convolution_param {{ num_output: 4 group: 4 kernel_size: 3 pad: 1 stride: 2 {FILL} }}",
        ((2, 4, 7, 6),),
    ),
]


def _check(type_, snippet, shape, *, stride, pad, dilation, group=None):
    layer, (x,) = make_layer(
        f"convolution_param {{ {snippet} {FILL} }}", [shape], type=type_, dtype=torch.float64
    )
    w = layer.weight.detach().numpy()
    b = layer.bias.detach().numpy() if layer.bias_term else None
    want = ref_conv(x.numpy(), w, b, stride, pad, dilation, group or shape[1])
    np.testing.assert_allclose(layer(x).detach().numpy(), want, rtol=1e-10, atol=1e-12)
    return layer


@pytest.mark.parametrize(
    "snippet,kernel,stride,pad,dilation",
    [
        # num_output and group are ignored: one filter per input channel
        ("num_output: 9 kernel_size: 3 pad: 1 stride: 2", (3, 3), (2, 2), (1, 1), (1, 1)),
        (
            "kernel_size: 3 kernel_size: 2 stride: 1 stride: 2 pad: 2 pad: 0 dilation: 2",
            (3, 2),
            (1, 2),
            (2, 0),
            (2, 2),
        ),
        # kernel_h/kernel_w win over kernel_size when both are set; absent stride / pad: 1 / 0
        ("kernel_size: 5 kernel_h: 1 kernel_w: 3", (1, 3), (1, 1), (0, 0), (1, 1)),
        # a lone stride_h is not read: the repeated stride (absent: 1) is used
        (
            "kernel_size: 2 stride_h: 3 pad_h: 1 pad_w: 1 bias_term: false",
            (2, 2),
            (1, 1),
            (1, 1),
            (1, 1),
        ),
    ],
)
def test_forward_convolution_depthwise(snippet, kernel, stride, pad, dilation):
    layer = _check(
        "ConvolutionDepthwise", snippet, (2, 4, 7, 6), stride=stride, pad=pad, dilation=dilation
    )
    assert tuple(layer.weight.shape) == (4, 1, *kernel)
    assert [tuple(b.shape) for b in layer.param_blobs()[1:]] == (
        [] if "bias_term" in snippet else [(4,)]
    )


def test_forward_depthwise_convolution_is_convolution():
    layer = _check(
        "DepthwiseConvolution",
        "num_output: 4 group: 4 kernel_size: 3 pad: 1",
        (2, 4, 7, 6),
        stride=(1, 1),
        pad=(1, 1),
        dilation=(1, 1),
    )
    assert tuple(layer.weight.shape) == (4, 1, 3, 3)
    layer = _check(
        "DepthwiseConvolution",
        "num_output: 6 group: 2 kernel_size: 2 stride: 2",
        (2, 4, 7, 6),
        stride=(2, 2),
        pad=(0, 0),
        dilation=(1, 1),
        group=2,
    )
    assert tuple(layer.weight.shape) == (6, 2, 2, 2)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, max_points=50)


@pytest.mark.parametrize(
    "snippet,shape,field",
    [
        ("num_output: 4", (2, 4, 5, 6), "kernel_size"),
        ("kernel_size: 3", (2, 4, 5), "4 axes"),
        ("kernel_size: 3 stride: 0", (2, 4, 5, 6), "stride"),
        ("kernel_size: 7", (2, 4, 5, 6), "output size"),
    ],
)
def test_error_convolution_depthwise(snippet, shape, field):
    with pytest.raises(LayerParamError, match=rf"layer 'w1' \(ConvolutionDepthwise\).*{field}"):
        make_layer(
            f"convolution_param {{ {snippet} }}", [shape], type="ConvolutionDepthwise", name="w1"
        )


def test_error_depthwise_convolution_checks_as_convolution():
    with pytest.raises(LayerParamError, match=r"layer 'w1' \(DepthwiseConvolution\).*group"):
        make_layer(
            "convolution_param { num_output: 4 group: 3 kernel_size: 3 }",
            [(2, 4, 5, 6)],
            type="DepthwiseConvolution",
            name="w1",
        )
