"""A large InnerProduct in a compiled CPU graph, or a large 1x1 Convolution over 1x1 features
(MobileNetV2's classifier), runs on oneDNN's product as an opaque op (``ops/onednn_linear``),
forward and backward, with the eager net's values."""

from __future__ import annotations

import pytest
import torch
from google.protobuf import text_format

import torchcaffe
from torchcaffe.ops import onednn_linear
from torchcaffe.proto import caffe_pb2

from ..helpers.graphs import calls_of
from ..helpers.params import fill_params

pytestmark = pytest.mark.skipif(
    onednn_linear._GRAPH_LINEAR is None, reason="this torch build has no oneDNN linear op"
)

OP = "torchcaffe.onednn_linear.default"

# ip1: 512 * 600 = 307200 weights (>= MIN_WEIGHTS), ip2: 600 * 10 (below it, torch's)
NET = """
input: "data" input_shape { dim: 3 dim: 512 }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "a"
  inner_product_param { num_output: 600 } }
layer { name: "relu" type: "ReLU" bottom: "a" top: "a" }
layer { name: "ip2" type: "InnerProduct" bottom: "a" top: "out"
  inner_product_param { num_output: 10 } }
"""

# the same products as 1x1 Convolutions over 1x1 features: conv1 512 * 600 weights, conv2
# 600 * 10
CONV_NET = """
input: "data" input_shape { dim: 3 dim: 512 dim: 1 dim: 1 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "a"
  convolution_param { num_output: 600 kernel_size: 1 } }
layer { name: "relu" type: "ReLU" bottom: "a" top: "a" }
layer { name: "conv2" type: "Convolution" bottom: "a" top: "out"
  convolution_param { num_output: 10 kernel_size: 1 } }
"""

NETS = {"inner_product": (NET, (3, 512)), "conv_classifier": (CONV_NET, (3, 512, 1, 1))}


def _net(kind: str = "inner_product") -> torchcaffe.TorchNet:
    proto = NETS[kind][0]
    net = torchcaffe.load(text_format.Parse(proto, caffe_pb2.NetParameter()), phase="test")
    fill_params(net, lambda t, gen: (torch.rand(t.shape, generator=gen) - 0.5) * 0.2)
    return net


def _input(kind: str = "inner_product") -> torch.Tensor:
    return torch.randn(*NETS[kind][1], generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("kind", sorted(NETS))
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_only_the_large_product_becomes_the_op(grad, kind):
    assert calls_of(_net(kind), OP, grad, data=_input(kind)) == 1


@pytest.mark.parametrize("kind", sorted(NETS))
def test_inductor_forward_and_backward_equal_eager(kind):
    net, x = _net(kind), _input(kind)
    w = torch.randn(3, 10, *x.shape[2:], generator=torch.Generator().manual_seed(5))

    def grads(run):
        net.zero_grad(set_to_none=True)
        out = run(data=x)["out"]
        (out * w).sum().backward()
        return out.detach(), [p.grad.clone() for p in net.parameters()]

    want_out, want = grads(net)
    torch._dynamo.reset()
    got_out, got = grads(torch.compile(net))
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_keeps_torchs_product(strict):
    """An exported program stands alone: torch's ops, in both tracing modes."""
    with torch.no_grad():
        program = torch.export.export(_net(), (), {"data": _input()}, strict=strict)
    assert not any("torchcaffe" in str(n.target) for n in program.graph.nodes)
