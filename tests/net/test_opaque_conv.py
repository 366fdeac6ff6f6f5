"""Large convolutions in a compiled CPU inference graph run as one opaque op on the eager,
cached path (``ops/opaque_conv``): which ones, their values, and what the op refuses."""

from __future__ import annotations

import copy

import pytest
import torch
from google.protobuf import text_format

import torchcaffe
from torchcaffe.errors import TorchCaffeError
from torchcaffe.ops import onednn_conv, opaque_conv
from torchcaffe.proto import caffe_pb2

from ..helpers.graphs import calls_of
from ..helpers.params import centered_weights, fill_params

pytestmark = pytest.mark.skipif(
    opaque_conv._CACHED_CONV2D is None, reason="this torch build has no oneDNN packed convolution"
)

OP = "torchcaffe.cached_conv2d.default"

# conv1 (64 -> 512, 3x3: 294912 weights) folded with BatchNorm + Scale, conv2 (1x1, 512 ->
# 512: 262144) alone: both take the op. conv3 (512 -> 16, 3x3: 73728) is too small, and the
# classifier runs over one pixel: both stay torch's.
NET = """
input: "data" input_shape { dim: 2 dim: 64 dim: 6 dim: 6 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "c1"
  convolution_param { num_output: 512 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "bn1" type: "BatchNorm" bottom: "c1" top: "c1" }
layer { name: "sc1" type: "Scale" bottom: "c1" top: "c1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "conv2" type: "Convolution" bottom: "c1" top: "c2"
  convolution_param { num_output: 512 kernel_size: 1 } }
layer { name: "conv3" type: "Convolution" bottom: "c2" top: "c3"
  convolution_param { num_output: 16 kernel_size: 3 } }
layer { name: "pool" type: "Pooling" bottom: "c2" top: "p"
  pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "Convolution" bottom: "p" top: "fc"
  convolution_param { num_output: 600 kernel_size: 1 } }
"""


def _net() -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(NET, caffe_pb2.NetParameter()), phase="test")
    fill_params(net, centered_weights(0.1))
    return net.eval()


def _input(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 64, 6, 6, generator=torch.Generator().manual_seed(3))


def _op_calls(net: torchcaffe.TorchNet, x: torch.Tensor, grad: bool = False) -> int:
    return calls_of(net, OP, grad, data=x)


def _close(got: dict, want: dict) -> None:
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5)


def test_the_two_large_convolutions_become_the_op():
    assert _op_calls(_net(), _input()) == 2


def test_a_pointwise_convolution_takes_the_op_only_inside_a_channels_last_region():
    """conv2 (1x1) follows conv1's op, whose top is channels_last; alone over the NCHW input
    it would pack nothing and only start a layout change."""
    alone = NET.replace('bottom: "c1" top: "c2"', 'bottom: "data" top: "c2"')
    alone = alone.replace("dim: 64", "dim: 512")
    net = torchcaffe.load(text_format.Parse(alone, caffe_pb2.NetParameter()), phase="test")
    x = torch.randn(2, 512, 6, 6)
    assert _op_calls(net.eval(), x) == 1  # conv1 (now 512 -> 512, 3x3) only


def test_no_op_while_autograd_records_or_mkldnn_is_off():
    net = _net()
    assert _op_calls(net, _input(), grad=True) == 0
    with torch.backends.mkldnn.flags(enabled=False):
        assert _op_calls(net, _input()) == 0


def test_inductor_values_equal_eager_and_follow_new_weights():
    net, x = _net(), _input()
    torch._dynamo.reset()
    compiled = torch.compile(net)
    with torch.inference_mode():
        _close(compiled(data=x), net(data=x))
        conv1 = net.layers["conv1"]
        assert len(conv1.graph_folds) == 1  # the op built the fold and keeps it
        with torch.no_grad():  # a new BatchNorm variance and conv2 weight, in place
            net.layers["bn1"].param_blobs()[1].mul_(4.0)
            net.layers["conv2"].weight.mul_(-1.0)
        _close(compiled(data=x), net(data=x))


def test_dynamic_batch_compile_runs_the_op_at_two_sizes():
    net = _net()
    torch._dynamo.reset()
    compiled = torch.compile(net, dynamic=True)
    with torch.inference_mode():
        for batch in (1, 3):
            x = _input(batch)
            _close(compiled(data=x), net(data=x))


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_keeps_torchs_convolutions(strict):
    """An exported program stands alone: torch's ops, in both tracing modes."""
    net = _net()
    with torch.no_grad():
        program = torch.export.export(net, (), {"data": _input()}, strict=strict)
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert not any("torchcaffe" in t for t in targets)


def test_a_copied_layer_has_its_own_handle():
    layer = _net().layers["conv2"]
    twin = copy.deepcopy(layer)
    assert twin.graph_handle != layer.graph_handle
    assert opaque_conv._layer(twin.graph_handle) is twin


def test_the_op_refuses_a_dead_layer_or_tensors_not_its_own():
    net, x = _net(), _input().contiguous(memory_format=torch.channels_last)
    conv2 = net.layers["conv2"]
    x2 = torch.randn(2, 512, 6, 6)
    with torch.inference_mode():
        y = torch.ops.torchcaffe.cached_conv2d(x2, conv2.sources(), [conv2.graph_handle])
        torch.testing.assert_close(y, conv2(x2), rtol=1e-5, atol=1e-5)
        with pytest.raises(TorchCaffeError, match="not its layers'"):
            torch.ops.torchcaffe.cached_conv2d(
                x2, [conv2.weight.clone(), conv2.bias], [conv2.graph_handle]
            )
        handle = opaque_conv.register(torch.nn.Module())  # dies at once
        with pytest.raises(TorchCaffeError, match="no longer exists"):
            torch.ops.torchcaffe.cached_conv2d(x, conv2.sources(), [handle])


@pytest.mark.parametrize("shape", [(2, 512, 6, 6), (1, 3, 1, 1), (1, 1, 5, 7), (4, 16, 1, 9)])
def test_the_op_computes_the_channels_last_strides_torch_allocates(shape):
    """The op checks its top against these strides (the layout its fake promised) without
    allocating a tensor to read them from; size-1 axes included."""
    want = torch.empty(shape, memory_format=torch.channels_last).stride()
    assert opaque_conv.channels_last_strides(shape) == want


def test_the_fold_in_the_op_runs_on_packed_weights(monkeypatch):
    """The op's fold reaches oneDNN's packed convolution (what it is there for)."""
    packed = []
    real = onednn_conv.PackedConvWeight.conv2d

    def spy(self, *args):
        packed.append(tuple(args[1].shape))
        return real(self, *args)

    monkeypatch.setattr(onednn_conv.PackedConvWeight, "conv2d", spy)
    net = _net()
    torch._dynamo.reset()
    with torch.inference_mode():
        torch.compile(net)(data=_input())
    assert (512, 64, 3, 3) in packed


def test_params_changed_reaches_the_ops_folds():
    """A write the tensor versions do not show (a numpy view), then ``params_changed``."""
    net, x = _net(), _input()
    torch._dynamo.reset()
    compiled = torch.compile(net)
    with torch.inference_mode():
        compiled(data=x)
    net.layers["bn1"].param_blobs()[1].detach().numpy()[:] *= 9.0
    net.params_changed()
    with torch.inference_mode():
        _close(compiled(data=x), net(data=x))


def test_the_op_shares_the_eager_programs_fold():
    """A net that ran eagerly first keeps one folded, packed copy of conv1's weights."""
    net, x = _net(), _input()
    with torch.inference_mode():
        net(data=x)
    (eager_fold,) = net.layers["conv1"].graph_folds.values()
    torch._dynamo.reset()
    with torch.inference_mode():
        torch.compile(net)(data=x)
    assert list(net.layers["conv1"].graph_folds.values()) == [eager_fold]


def test_a_parametrized_convolution_runs_in_the_op():
    """A parametrized weight (torch.nn.utils.parametrize) is computed anew on each read, so
    the graph hands the op a tensor that is not the layer's: the op computes it the same way
    (it raised before)."""

    class Doubled(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    net, x = _net(), _input()
    torch.nn.utils.parametrize.register_parametrization(net.layer("conv2"), "weight", Doubled())
    with torch.inference_mode():
        want = net(data=x)
    torch._dynamo.reset()
    assert _op_calls(net, x) == 2
    with torch.inference_mode():
        _close(torch.compile(net)(data=x), want)
