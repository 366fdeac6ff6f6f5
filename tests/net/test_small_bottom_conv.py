"""small_bottom_conv: in a compiled CPU graph, a batch-1 convolution that aten would send to its
im2col kernel, with enough work, runs on oneDNN's op, with the eager net's values and its top
in the bottom's layout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from google.protobuf import text_format

import torchcaffe
from torchcaffe.ops import small_bottom_conv
from torchcaffe.proto import caffe_pb2

from ..helpers.graphs import calls_of
from ..helpers.params import fill_params

pytestmark = pytest.mark.skipif(
    small_bottom_conv._CONV is None, reason="this torch build has no oneDNN convolution op"
)

OP = "mkldnn._convolution_pointwise"

# MobileNetV2's 96 -> 576 1x1 expansion at 14x14 (18,816 bottom elements, 10.8M multiply-adds)
# with its ReLU, then a 3x3 one of 35M multiply-adds (GoogLeNet's inception_4a), and a small
# 1x1 one (2.4M multiply-adds) that aten's im2col kernel runs faster
NET = """
input: "data" input_shape { dim: %d dim: 96 dim: 14 dim: 14 }
layer { name: "expand" type: "Convolution" bottom: "data" top: "a"
  convolution_param { num_output: 576 kernel_size: 1 } }
layer { name: "relu" type: "ReLU" bottom: "a" top: "a" }
layer { name: "reduce" type: "Convolution" bottom: "a" top: "b"
  convolution_param { num_output: 96 kernel_size: 1 } }
layer { name: "conv3" type: "Convolution" bottom: "b" top: "c"
  convolution_param { num_output: 208 kernel_size: 3 pad: 1 } }
layer { name: "pool" type: "Pooling" bottom: "c" top: "d"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "small" type: "Convolution" bottom: "d" top: "out"
  convolution_param { num_output: 64 kernel_size: 1 } }
"""


def _net(batch: int) -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(NET % batch, caffe_pb2.NetParameter()), phase="test")
    fill_params(net, lambda t, gen: (torch.rand(t.shape, generator=gen) - 0.5) * 0.2)
    return net


def _input(batch: int) -> torch.Tensor:
    return torch.randn(batch, 96, 14, 14, generator=torch.Generator().manual_seed(3))


def test_the_two_large_batch_1_convolutions_take_the_op():
    """expand and conv3; not reduce (a bottom of 112,896 elements: aten's oneDNN path) nor
    small (below MIN_MACS)."""
    assert calls_of(_net(1), OP, data=_input(1)) == 2


@pytest.mark.parametrize(
    "batch, grad", [(2, False), (1, True)], ids=["batch-2", "autograd-recording"]
)
def test_no_op_where_aten_takes_onednn_or_autograd_records(batch, grad):
    assert calls_of(_net(batch), OP, grad, data=_input(batch)) == 0


def test_inductor_equals_eager():
    net, x = _net(1), _input(1)
    with torch.no_grad():
        want = net(data=x)["out"]
        torch._dynamo.reset()
        got = torch.compile(net)(data=x)["out"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
@pytest.mark.parametrize(
    "kernel, stride, pad, dilation", [(1, 1, 0, 1), (3, 2, 1, 1), (3, 1, 2, 2)]
)
def test_values_and_layout_those_of_conv2d(channels_last, kernel, stride, pad, dilation):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1, 32, 9, 9, generator=gen)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(48, 32, kernel, kernel, generator=gen) * 0.1
    b = torch.randn(48, generator=gen)
    args = ((stride, stride), (pad, pad), (dilation, dilation), 1)
    want = F.conv2d(x, w, b, *args)
    torch._dynamo.reset()  # inductor's lowering lays its top out channels_last
    for run in (small_bottom_conv.conv2d, torch.compile(small_bottom_conv.conv2d)):
        got = run(x, w, b, args)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert got.is_contiguous(memory_format=torch.channels_last) == channels_last
        assert got.is_contiguous() != channels_last


@pytest.mark.parametrize("stride, calls", [(1, 1), (2, 0)])
def test_the_work_counted_is_the_tops(stride, calls):
    """64 -> 64 3x3 over 14x14: 7.2M multiply-adds at stride 1, a quarter at stride 2."""
    proto = f"""
    input: "data" input_shape {{ dim: 1 dim: 64 dim: 14 dim: 14 }}
    layer {{ name: "conv" type: "Convolution" bottom: "data" top: "out"
      convolution_param {{ num_output: 64 kernel_size: 3 pad: 1 stride: {stride} }} }}
    """
    net = torchcaffe.load(text_format.Parse(proto, caffe_pb2.NetParameter()), phase="test")
    assert calls_of(net, OP, data=torch.randn(1, 64, 14, 14)) == calls
