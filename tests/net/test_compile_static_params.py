"""``torch.compile(net, dynamic=True)`` makes the inputs' sizes symbols, not the params'.

Dynamo gives static shapes to exact ``nn.Parameter``s and to blobs read as module attributes.
The passes read a layer's blobs from its dicts and a learnable blob is a ``CaffeParameter``,
so every size of every blob was a symbol, duck-sized with the image's: Inception-v3's graph
had 470 symbolic blobs, and inductor failed to lower a convolution whose size mixed the
kernel's symbol into the image's. ``untraced_build.mark_static_shapes`` marks them while the
trace is made. No timings here: the tests read the shapes dynamo gave the graph's inputs.
"""

from __future__ import annotations

import copy

import pytest
import torch
from google.protobuf import text_format

import torchcaffe
from torchcaffe.net import untraced_build
from torchcaffe.proto import caffe_pb2

from .test_compile_cold import Head

# A convolution with BatchNorm, Scale and ReLU folded in (its blobs read from the layers'
# dicts), then one whose 3x3 kernel has the input's 3 channels: a duck-sized symbol for both.
FOLDED = """
name: "folded"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 2 dim: 3 dim: 15 dim: 13 } } }
layer { name: "c1" type: "Convolution" bottom: "data" top: "c1"
  convolution_param { num_output: 3 kernel_size: 3 stride: 2 bias_term: false
    weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn" type: "BatchNorm" bottom: "c1" top: "c1"
  batch_norm_param { use_global_stats: true } }
layer { name: "sc" type: "Scale" bottom: "c1" top: "c1"
  scale_param { bias_term: true filler { type: "constant" value: 1.5 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "pool" type: "Pooling" bottom: "c2" top: "pool"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
"""


def _net() -> torchcaffe.TorchNet:
    torch.manual_seed(0)
    net = torchcaffe.load(text_format.Parse(FOLDED, caffe_pb2.NetParameter()), phase="test")
    with torch.no_grad():
        bn = net.layers["bn"]
        bn.mean.uniform_(-0.5, 0.5)
        bn.variance.uniform_(0.5, 1.5)
        bn.scale_factor.fill_(1.0)
    return net.eval()


def _graph_inputs(module, x: torch.Tensor) -> list[tuple[str, tuple]]:
    """(name, shape) of each tensor input of the graph dynamo makes of ``module(data=x)``,
    compiled with ``dynamic=True``; checks that dynamo made one graph."""
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(module, dynamic=True, backend=record)(data=x)
    torch._dynamo.reset()
    assert len(graphs) == 1
    shapes = []
    for node in graphs[0].graph.nodes:
        value = node.meta.get("example_value")
        if node.op == "placeholder" and isinstance(value, torch.Tensor):
            shapes.append((node.name, tuple(value.shape)))
    return shapes


def _symbolic(shape: tuple) -> bool:
    return any(not isinstance(size, int) for size in shape)


def _only_the_input_is_symbolic(inputs: list[tuple[str, tuple]]) -> None:
    symbolic = [name for name, shape in inputs if _symbolic(shape)]
    assert len(inputs) > 6  # the input and the two convolutions' and the chain's blobs
    assert len(symbolic) == 1 and "data" in symbolic[0], symbolic


@pytest.mark.parametrize("eager_first", [False, True], ids=["fresh", "ran-eagerly"])
def test_dynamic_compile_gives_the_blobs_static_shapes(eager_first):
    net, x = _net(), torch.randn(2, 3, 15, 13)
    if eager_first:  # its program already built: the trace still marks the blobs
        with torch.no_grad():
            net(data=x)
    _only_the_input_is_symbolic(_graph_inputs(net, x))


@pytest.mark.parametrize(
    "remake",
    [lambda net: net.double().float(), copy.deepcopy],
    ids=["dtype-round-trip", "deepcopy"],
)
def test_blobs_that_a_conversion_or_a_copy_replaced_are_marked_too(remake):
    net = _net()
    with torch.no_grad():
        net(data=torch.randn(2, 3, 15, 13))
    net = remake(net)
    _only_the_input_is_symbolic(_graph_inputs(net, torch.randn(2, 3, 15, 13)))


def test_a_net_inside_a_model_gets_static_blob_shapes():
    model = Head(_net(), "pool")
    _only_the_input_is_symbolic(_graph_inputs(model, torch.randn(2, 3, 15, 13)))


def test_a_static_compile_leaves_the_blobs_unmarked():
    """Without ``dynamic=True`` a blob's shape is static anyway, and a mark would cost each
    call's guard check an attribute compare per blob."""
    net = _net()
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(net, backend="eager")(data=torch.randn(2, 3, 15, 13))
    torch._dynamo.reset()
    blobs = [*net.parameters(), *net.buffers()]
    assert blobs and not any(hasattr(t, untraced_build.STATIC_MARK) for t in blobs)


def test_a_users_dynamic_mark_is_kept():
    net = _net()
    mean = net.layers["bn"].mean
    torch._dynamo.mark_dynamic(mean, 0)
    untraced_build.mark_static_shapes(net)
    assert not hasattr(mean, untraced_build.STATIC_MARK)
    assert getattr(net.layers["c1"].weight, untraced_build.STATIC_MARK) == {0, 1, 2, 3}


def test_dynamic_compile_runs_at_two_image_sizes_and_compiles_once():
    net = _net()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(net, dynamic=True)
    with (
        torch.no_grad(),
        torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True),
    ):
        for size in ((15, 13), (19, 17)):  # one branch of the ceil-mode test
            x = torch.randn(2, 3, *size)
            torch.testing.assert_close(
                compiled(data=x)["pool"], net(data=x)["pool"], rtol=1e-5, atol=1e-5
            )
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_the_marks_are_those_of_torchs_mark_static():
    """``mark_static_shapes`` sets ``torch._dynamo.mark_static``'s marks itself (inside a trace
    that function would specialize symbols already made): every mark this torch's sets, and
    besides them at most the flag with which newer dynamo looks for marks at all (torch 2.13
    sets it; 2.11, on a GPU machine, set the indices alone)."""
    by_torch, by_us = torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)
    torch._dynamo.mark_static(by_torch)
    holder = torch.nn.Module()
    holder.register_buffer("blob", by_us)
    untraced_build.mark_static_shapes(holder)
    assert vars(by_us)[untraced_build.STATIC_MARK] == {0, 1, 2}
    for mark, value in vars(by_torch).items():
        assert vars(by_us).get(mark) == value, mark
    assert set(vars(by_us)) - set(vars(by_torch)) <= {"_has_dynamo_dim_marking"}
    assert vars(by_us)["_has_dynamo_dim_marking"] is True
