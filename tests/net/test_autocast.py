"""torch.autocast over a torch-face net: its convolutions and products run in the autocast
dtype, as F.conv2d / F.linear do, also where the CPU path would call oneDNN's own ops, eager
or compiled."""

from __future__ import annotations

import pytest
import torch

import torchcaffe
from torchcaffe.formats.prototxt import read_net

from ..helpers.graphs import calls_of

NET = """
input: "data" input_shape { dim: 2 dim: 8 dim: 16 dim: 16 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 16 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 100 weight_filler { type: "xavier" } } }
"""


@pytest.mark.parametrize("grad", [False, True])
def test_autocast_bfloat16_reaches_convolution_and_inner_product(grad):
    net = torchcaffe.load(read_net(NET), phase="test").eval()
    x = torch.rand(2, 8, 16, 16)
    with torch.set_grad_enabled(grad):
        want = net.forward_all_blobs(x)
        net.forward_all_blobs(x)  # a packed oneDNN call to replay
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = net.forward_all_blobs(x)
    assert got["conv"].dtype == got["ip"].dtype == torch.bfloat16
    for name in ("conv", "ip"):
        torch.testing.assert_close(got[name].float(), want[name], rtol=2e-2, atol=3e-2)
    assert net.forward_all_blobs(x)["ip"].dtype == torch.float32


# at batch 1, each of these takes a CPU route of its own in a compiled graph: expand oneDNN's
# op (``small_bottom_conv``), conv3 our packed-weight op (``opaque_conv``, 331,776 weights),
# ip our oneDNN product (``onednn_linear``, 1,254,400 weights)
COMPILED_NET = """
input: "data" input_shape { dim: 1 dim: 96 dim: 14 dim: 14 }
layer { name: "expand" type: "Convolution" bottom: "data" top: "expand"
        convolution_param { num_output: 576 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "conv3" type: "Convolution" bottom: "expand" top: "conv3"
        convolution_param { num_output: 64 kernel_size: 3 pad: 1
                            weight_filler { type: "xavier" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv3" top: "ip"
        inner_product_param { num_output: 100 weight_filler { type: "xavier" } } }
"""
ROUTES = (
    "mkldnn._convolution_pointwise",
    "torchcaffe.cached_conv2d.default",
    "torchcaffe.onednn_linear.default",
)


def test_autocast_bfloat16_reaches_a_compiled_graphs_cpu_routes():
    net = torchcaffe.load(read_net(COMPILED_NET), phase="test").eval()
    x = torch.rand(1, 96, 14, 14)
    if [calls_of(net, op, data=x) for op in ROUTES] != [1, 1, 1]:
        pytest.skip("this torch build lacks one of the CPU routes")
    with torch.no_grad():
        want = net.forward_all_blobs(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch._dynamo.reset()
            got = torch.compile(net.forward_all_blobs)(x)
    for name in ("expand", "conv3", "ip"):
        assert got[name].dtype == torch.bfloat16, name
        torch.testing.assert_close(got[name].float(), want[name], rtol=2e-2, atol=3e-2)


FOLDED_NET = """
input: "data" input_shape { dim: 2 dim: 3 dim: 8 dim: 8 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
        convolution_param { num_output: 4 kernel_size: 3 bias_term: false
                            weight_filler { type: "xavier" } } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
"""


def test_autocast_keeps_a_compiled_folds_top_in_the_autocast_dtype():
    """A compiled fold that runs the convolution, then the chain as one multiply-add (a small
    convolution at batch 2), applies the chain's float32 (a, c) in the top's bfloat16, as the
    eager fold's convolution gives it: type promotion made the compiled top float32."""
    net = torchcaffe.load(read_net(FOLDED_NET), phase="test").eval()
    with torch.no_grad():
        net.layer("bn").variance.uniform_(0.5, 1.5)
        net.layer("bn").scale_factor.fill_(1.0)
    x = torch.rand(2, 3, 8, 8)
    torch._dynamo.reset()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = net(data=x)["c"]
        got = torch.compile(net)(data=x)["c"]
    assert want.dtype == got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
