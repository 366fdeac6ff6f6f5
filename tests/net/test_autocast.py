"""torch.autocast over a torch-face net: its convolutions and products run in the autocast
dtype, as F.conv2d / F.linear do, also where the CPU path would call oneDNN's own ops."""

from __future__ import annotations

import pytest
import torch

import torchcaffe
from torchcaffe.formats.prototxt import read_net

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
