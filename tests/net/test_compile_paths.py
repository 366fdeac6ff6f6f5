"""What torch.compile traces: the compile-only formulations are the ones taken, and their
values equal the eager net's.

A recording backend keeps dynamo's FX graphs (no inductor), so the tests read which torch
calls each layer became; one test runs inductor itself over a net with every such layer.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from google.protobuf import text_format

import torchcaffe
from torchcaffe.proto import caffe_pb2

from ..helpers.params import centered_weights, fill_params

FLT_MAX = 3.4028234663852886e38

# A conv (enough channels and positions for the layout pass) folded with BatchNorm + Scale,
# an in-place ReLU, MAX pooling (torch's ceil mode) and one needing an explicit pad, LRN, AVE
# pooling and a Concat of two branches.
NET = """
input: "data" input_shape { dim: 2 dim: 3 dim: 30 dim: 30 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 16 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "conv2" type: "Convolution" bottom: "c" top: "d"
  convolution_param { num_output: 16 kernel_size: 3 pad: 1 } }
layer { name: "pool" type: "Pooling" bottom: "d" top: "p"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "pool_pad" type: "Pooling" bottom: "d" top: "q"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 2 } }
layer { name: "lrn" type: "LRN" bottom: "p" top: "n" lrn_param { local_size: 5 alpha: 0.1 } }
layer { name: "ave" type: "Pooling" bottom: "q" top: "a"
  pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "conv3" type: "Convolution" bottom: "n" top: "e"
  convolution_param { num_output: 8 kernel_size: 1 } }
layer { name: "cat" type: "Concat" bottom: "e" bottom: "n" top: "out" }
layer { name: "pool_a" type: "Pooling" bottom: "a" top: "out_a"
  pooling_param { pool: MAX kernel_size: 2 stride: 1 } }
"""


def _net() -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(NET, caffe_pb2.NetParameter()), phase="test")
    fill_params(net, centered_weights(0.3))
    return net.eval()


def _input() -> torch.Tensor:
    """Random data with the values Caffe's MAX never selects: NaN and -inf, whole windows too."""
    x = torch.randn(2, 3, 30, 30, generator=torch.Generator().manual_seed(1))
    x[0, :, :4, :4] = math.nan
    x[1, :, 5, 7] = -math.inf
    x[1, 0, 9, 9] = math.inf
    return x


def _graphs(net: torchcaffe.TorchNet, x: torch.Tensor) -> list[torch.fx.GraphModule]:
    graphs: list[torch.fx.GraphModule] = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.inference_mode():
        torch.compile(net, backend=record, fullgraph=True)(data=x)
    return graphs


def _calls(graphs: list[torch.fx.GraphModule]) -> list[str]:
    """Every call in the graphs, as torch's function name or the tensor method's name."""
    out = []
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op == "call_function":
                out.append(getattr(node.target, "__name__", str(node.target)))
            elif node.op == "call_method":
                out.append(node.target)
    return out


@pytest.fixture(scope="module")
def traced() -> list[str]:
    return _calls(_graphs(_net(), _input()))


def test_eager_program_does_convert_layouts_and_fold():
    """The eager program this file's net runs: what the compiled one must leave out."""
    report = _net().optimized_program().report
    assert report["channels_last_layout"] >= 3
    assert report["fold_batchnorm_scale_into_producer"] == 1


def test_compiled_net_keeps_torch_layouts(traced):
    """Inductor picks layouts itself; our channels_last round trips would be real copies."""
    assert "contiguous" not in traced


def test_compiled_max_pool_floors_with_one_where(traced):
    """nan_to_num's isnan is not vectorized in inductor's CPU code; a compare and a where is."""
    assert "nan_to_num" not in traced
    assert traced.count("max_pool2d") == 3
    assert traced.count("where") >= 3


# A wide 3x3 convolution over 2x2 positions (more weights than top values) with BatchNorm +
# Scale, and a 1x1 one over 6x6 (fewer): the first gets the epilogue, the second the fold.
FOLDS = """
input: "data" input_shape { dim: 1 dim: 8 dim: 2 dim: 2 }
layer { name: "wide" type: "Convolution" bottom: "data" top: "w"
  convolution_param { num_output: 32 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "bn" type: "BatchNorm" bottom: "w" top: "w" }
layer { name: "sc" type: "Scale" bottom: "w" top: "w" scale_param { bias_term: true } }
layer { name: "up" type: "Deconvolution" bottom: "w" top: "u"
  convolution_param { num_output: 4 kernel_size: 3 stride: 3 } }
layer { name: "pw" type: "Convolution" bottom: "u" top: "p"
  convolution_param { num_output: 5 kernel_size: 1 } }
layer { name: "bn2" type: "BatchNorm" bottom: "p" top: "p" }
layer { name: "sc2" type: "Scale" bottom: "p" top: "p" }
"""


def _folds_net() -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(FOLDS, caffe_pb2.NetParameter()), phase="test")
    fill_params(net, lambda t, gen: torch.rand(t.shape, generator=gen) + 0.5, seed=2)
    return net.eval()


def test_compiled_folds_are_an_epilogue_or_a_fold_in_the_graph():
    """Params are not frozen under compile, so the fold runs in every call: a wide
    convolution keeps its weight and gets one addcmul (fused into its epilogue), a small one
    at batch 1 gets its weight scaled in the graph (one multiply over the weight), never the
    float64 fold the eager cache uses."""
    net = _folds_net()
    assert net.optimized_program().report["fold_batchnorm_scale_into_producer"] == 2
    graphs = _graphs(net, torch.rand(1, 8, 2, 2))
    assert _conv_weights(graphs) == ["placeholder", "mul"]
    assert "double" not in _calls(graphs)
    # the epilogue reads (a, c) from a stack; the weight's multiply computes them itself
    assert _calls(graphs).count("stack") == 1
    # at batch 2 both take the epilogue (the fold's bias would be copied into the top)
    graphs = _graphs(net, torch.rand(2, 8, 2, 2))
    assert _conv_weights(graphs) == ["placeholder", "placeholder"]
    assert _calls(graphs).count("stack") == 2


def test_compiled_folds_off_the_cpu_are_epilogues_at_batch_1_too():
    """Off the CPU (meta stands in for a GPU here) no weight is scaled in the graph at batch 1,
    and no (a, c) is stacked: a GPU's inference call is bound by its launches, and the scaled
    weight and the stack are a kernel more each. The epilogues compute (a, c) themselves."""
    net = _folds_net().to("meta")
    for batch in (1, 2):
        graphs = _graphs(net, torch.empty(batch, 8, 2, 2, device="meta"))
        assert _conv_weights(graphs) == ["placeholder", "placeholder"]
        calls = _calls(graphs)
        assert "stack" not in calls and calls.count("addcmul") >= 2, calls


def test_compiled_epilogue_reads_the_affine_computed_once():
    """Inductor inlines small pointwise inputs into their consumers; stacked, the chain's
    per-channel (a, c) are computed in a kernel of their own (the rsqrt, BatchNorm's
    scale_factor reciprocal), and each convolution's epilogue only reads them."""
    from torch._inductor.utils import run_and_get_code

    net = _folds_net()
    torch._dynamo.reset()
    with torch.inference_mode():
        _, code = run_and_get_code(torch.compile(net), data=torch.rand(2, 8, 2, 2))
    kernels = set(re.findall(r"cpp_fused_\w+", "\n".join(code)))
    affine = [k for k in kernels if "rsqrt" in k]  # the chain's (a, c), computed once
    epilogues = [k for k in kernels if "addcmul" in k and k not in affine]  # per convolution
    assert len(affine) == 1 and len(epilogues) == 2, kernels
    assert not any("reciprocal" in k for k in epilogues), kernels


# BatchNorm + Scale after a pooling: no producer to fold into, the chain runs alone.
ALONE = """
input: "data" input_shape { dim: 2 dim: 4 dim: 6 dim: 6 }
layer { name: "pool" type: "Pooling" bottom: "data" top: "p"
  pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "bn" type: "BatchNorm" bottom: "p" top: "p" }
layer { name: "sc" type: "Scale" bottom: "p" top: "p" scale_param { bias_term: true } }
"""


def test_compiled_chain_without_producer_is_one_stacked_multiply_add():
    """A chain alone runs as x * a + c with (a, c) stacked in the graph, in the links' dtype
    (no float64 fold), and gives the eager values."""
    net = torchcaffe.load(text_format.Parse(ALONE, caffe_pb2.NetParameter()), phase="test")
    fill_params(net, lambda t, gen: torch.rand(t.shape, generator=gen) + 0.5, seed=3)
    net.eval()
    assert net.optimized_program().report["fold_batchnorm_into_scale"] == 1
    x = torch.rand(2, 4, 6, 6)
    calls = _calls(_graphs(net, x))
    assert "stack" in calls and "addcmul" in calls and "double" not in calls
    _close(*_compiled_and_eager(net, x), rtol=1e-5, atol=1e-6)


def _conv_weights(graphs: list[torch.fx.GraphModule]) -> list[str]:
    """Per conv2d: ``placeholder`` when its weight is a param as it is, else the producing
    call (``mul``: a weight scaled in the graph)."""
    out = []
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is torch.nn.functional.conv2d:
                w = node.args[1]
                out.append(w.op if w.op != "call_function" else w.target.__name__)
    return out


def test_compiled_folds_equal_eager():
    net, x = _folds_net(), torch.rand(1, 8, 2, 2)
    _close(*_compiled_and_eager(net, x), rtol=1e-5, atol=1e-6)


def _compiled_and_eager(net: torchcaffe.TorchNet, x: torch.Tensor) -> tuple[dict, dict]:
    """The outputs of ``net(data=x)`` compiled whole (aot_eager) and eager, for inference."""
    with torch.inference_mode():
        want = net(data=x)
    torch._dynamo.reset()
    with torch.inference_mode():
        got = torch.compile(net, backend="aot_eager", fullgraph=True)(data=x)
    return got, want


def _close(got: dict, want: dict, rtol: float, atol: float) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_allclose(
            got[name].numpy(), want[name].numpy(), rtol=rtol, atol=atol, equal_nan=True
        )


def _all_blobs(net: torchcaffe.TorchNet, backend: str) -> tuple[dict, dict]:
    """(eager, compiled) values of every blob, for one input with NaN and infinities."""
    x = _input()
    with torch.inference_mode():
        want = net.forward_all_blobs(data=x)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: net.forward_all_blobs(data=t), backend=backend)
    with torch.inference_mode():
        got = compiled(x)
    # the pools saw NaN (and whole windows of it) and gave Caffe's -FLT_MAX there
    assert want["d"].isnan().any()
    assert (want["p"] == -FLT_MAX).any() and (want["q"] == -FLT_MAX).any()
    return want, got


def test_recorded_graph_values_equal_eager():
    want, got = _all_blobs(_net(), "aot_eager")
    _close(got, want, rtol=1e-5, atol=1e-6)


def test_inductor_values_equal_eager():
    want, got = _all_blobs(_net(), "inductor")
    _close(got, want, rtol=1e-5, atol=1e-5)
