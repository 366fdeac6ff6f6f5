"""fuse_relu_into_producer (torchcaffe/net/passes/relu_fusion.py): where a ReLU joins the
Convolution or InnerProduct before it, that the values stay Caffe's (NaN included), and that
a leaky ReLU runs in oneDNN's epilogue."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from google.protobuf import text_format
from torch.utils._python_dispatch import TorchDispatchMode

import torchcaffe
from torchcaffe.ops import onednn_conv
from torchcaffe.proto import caffe_pb2

from ..helpers.counting import counting
from ..helpers.params import fill_params

RELU = "fuse_relu_into_producer"

# conv -> bn -> scale -> relu (in place, folded), a plain conv with a leaky ReLU, an
# InnerProduct with a ReLU writing a new blob; a ReLU on the net's input stays alone.
NET = """
input: "data" input_shape { dim: 2 dim: 4 dim: 9 dim: 9 }
layer { name: "r0" type: "ReLU" bottom: "data" top: "data" }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "dense" type: "Convolution" bottom: "c" top: "d"
  convolution_param { num_output: 8 kernel_size: 3 stride: 2 } }
layer { name: "leaky" type: "ReLU" bottom: "d" top: "d" relu_param { negative_slope: 0.1 } }
layer { name: "ip" type: "InnerProduct" bottom: "d" top: "f" inner_product_param { num_output: 6 } }
layer { name: "rf" type: "ReLU" bottom: "f" top: "g" }
"""


def _net(text: str = NET) -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="test")
    fill_params(net, lambda t, gen: torch.rand(t.shape, generator=gen) - 0.3, seed=4)
    return net.eval()


def _unoptimized(net: torchcaffe.TorchNet, x: torch.Tensor) -> dict[str, torch.Tensor]:
    net.optimize = False
    try:
        with torch.inference_mode():
            return net.forward_all_blobs(data=x)
    finally:
        net.optimize = True


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5, equal_nan=True)


def test_relus_join_their_producers():
    program = _net().optimized_program()
    assert program.report[RELU] == 3
    types = {s.name: s.type for s in program.steps}
    assert types["conv"] == "Convolution+BatchNorm+Scale+ReLU"
    assert types["dense"] == "Convolution+ReLU"
    assert types["ip"] == "InnerProduct+ReLU"
    assert types["r0"] == "ReLU"  # on the caller's input: no producer
    assert [s.tops for s in program.steps if s.name == "ip"] == [("g",)]


def test_a_relu_stays_alone_where_the_value_before_it_is_seen():
    net = _net()
    program = net.optimized_program(["g", "f"])  # f, the product before rf, is asked for
    assert program.report[RELU] == 2
    assert "rf" in [s.name for s in program.steps]
    # every blob observed: the in-place ReLUs still join (their blob's final value is the
    # ReLU's), rf does not
    assert net.optimized_program(net.blob_names).report[RELU] == 2
    read_twice = NET + 'layer { name: "t" type: "TanH" bottom: "f" top: "t" }'
    assert _net(read_twice).optimized_program().report[RELU] == 2  # f has another reader


@pytest.mark.parametrize("observe_all", [False, True])
def test_outputs_equal_the_unoptimized_net(observe_all):
    net = _net()
    x = torch.randn(2, 4, 9, 9, generator=torch.Generator().manual_seed(0))
    want = _unoptimized(net, x)
    with torch.inference_mode():
        got = net.forward_all_blobs(data=x) if observe_all else net(data=x)
    assert set(got) <= set(want)
    for name in got:
        _assert_close(got[name], want[name])


def test_nan_and_infinities_stay_caffes():
    """Caffe's ReLU keeps NaN (max(NaN, 0) is NaN); oneDNN's relu epilogue would make it 0,
    so a plain ReLU runs after the product. A leaky one keeps NaN and -inf in oneDNN."""
    net = _net()
    x = torch.randn(2, 4, 9, 9, generator=torch.Generator().manual_seed(1))
    x[0, :, 2:5, 2:5] = float("nan")
    x[1, 0, 0, 0] = float("inf")
    want = _unoptimized(net, x)
    assert want["c"].isnan().any() and want["g"].isnan().any()
    with torch.inference_mode():
        got = net.forward_all_blobs(data=x)
    for name in ("c", "d", "f", "g"):
        assert torch.equal(got[name].isnan(), want[name].isnan()), name
        _assert_close(got[name], want[name])


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif(not onednn_conv.available(), reason="this torch build has no oneDNN")
def test_a_leaky_relu_runs_in_onednns_epilogue():
    net = _net()
    x = torch.randn(2, 4, 9, 9)
    with torch.inference_mode():
        net(data=x)  # packs the weights
        with _Ops() as ops:
            net(data=x)
    assert "aten.leaky_relu_.default" not in ops.names  # dense's ReLU, in the epilogue
    # conv's and rf: after the product (bn's random variance, below -eps in places, makes the
    # fold's weights NaN; ip's product is torch's F.linear)
    assert ops.names.count("aten.relu_.default") == 2
    with torch.backends.mkldnn.flags(enabled=False), torch.inference_mode(), _Ops() as plain:
        got = net(data=x)
    assert plain.names.count("aten.leaky_relu_.default") == 1  # torch's kernels: in place
    _assert_close(got["g"], _unoptimized(net, x)["g"])


def test_a_compiled_net_gives_the_eager_values():
    net = _net()
    x = torch.randn(2, 4, 9, 9)
    with torch.inference_mode():
        want = net(data=x)
    torch._dynamo.reset()
    with torch.inference_mode():
        got = torch.compile(net, backend="aot_eager", fullgraph=True)(data=x)
    for name in want:
        _assert_close(got[name], want[name])


# A plain convolution, a folded one and a 1x1 one, each with a plain ReLU; the last two after
# layers that keep finite values finite. The pooling averages: Caffe's MAX pooling skips NaN
# (a window of NaN alone gives -FLT_MAX), and the overflow after it is no test of ReLUs.
FINITE = """
input: "data" input_shape { dim: 2 dim: 4 dim: 9 dim: 9 }
layer { name: "a" type: "Convolution" bottom: "data" top: "a"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "ra" type: "ReLU" bottom: "a" top: "a" }
layer { name: "pool" type: "Pooling" bottom: "a" top: "p"
  pooling_param { pool: AVE kernel_size: 2 stride: 1 } }
layer { name: "b" type: "Convolution" bottom: "p" top: "b"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "bn" type: "BatchNorm" bottom: "b" top: "b" }
layer { name: "sc" type: "Scale" bottom: "b" top: "b" scale_param { bias_term: true } }
layer { name: "rb" type: "ReLU" bottom: "b" top: "b" }
layer { name: "c" type: "Convolution" bottom: "b" top: "c"
  convolution_param { num_output: 8 kernel_size: 1 } }
layer { name: "rc" type: "ReLU" bottom: "c" top: "c" }
"""
# FINITE's tail with BatchNorm and Scale writing new blobs (so that either may run alone)
APART = """
layer { name: "bn" type: "BatchNorm" bottom: "b" top: "n" }
layer { name: "sc" type: "Scale" bottom: "n" top: "s" scale_param { bias_term: true } }
layer { name: "rs" type: "ReLU" bottom: "s" top: "s" }
layer { name: "c" type: "Convolution" bottom: "s" top: "c"
  convolution_param { num_output: 8 kernel_size: 1 } }
layer { name: "rc" type: "ReLU" bottom: "c" top: "c" }
"""


@pytest.fixture
def relu_epilogues(monkeypatch):
    """How many oneDNN convolutions ran a plain ReLU in their epilogue."""
    if not onednn_conv.available():
        pytest.skip("this torch build has no oneDNN packed convolution")
    count = [0]
    pack, conv = onednn_conv._OPS
    in_epilogue = counting(conv, count, only=lambda *args: args[-3] == "relu")
    monkeypatch.setattr(onednn_conv, "_OPS", (pack, in_epilogue))
    return count


def _finite_net() -> torchcaffe.TorchNet:
    net = _net(FINITE)
    with torch.no_grad():
        net.layer("bn").variance.uniform_(0.5, 1.5)
        net.layer("bn").scale_factor.fill_(1.0)
    return net


def _x(seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 4, 9, 9, generator=torch.Generator().manual_seed(seed))


def _assert_caffes(net: torchcaffe.TorchNet, x: torch.Tensor) -> None:
    want = _unoptimized(net, x)["c"]
    with torch.inference_mode():
        got = net(data=x)["c"]
    assert torch.equal(got.isnan(), want.isnan())
    _assert_close(got, want)


def test_a_finite_run_runs_plain_relus_in_onednns_epilogue(relu_epilogues, monkeypatch):
    net = _finite_net()
    assert net.optimized_program().finite_steps == 3
    x = _x()
    with torch.inference_mode():
        got = net(data=x)["c"]
    assert relu_epilogues[0] == 3
    _assert_close(got, _unoptimized(net, x)["c"])
    monkeypatch.setattr(torchcaffe.TorchNet, "_finite_run", lambda self, blobs, program: False)
    with torch.inference_mode():
        exact = net(data=x)["c"]
    assert relu_epilogues[0] == 3  # the ReLUs ran after the products
    assert torch.equal(got, exact)  # the same values


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_input_keeps_caffes_relus(relu_epilogues, value):
    net = _finite_net()
    x = _x(1)
    x[0, 1, 4, 4] = value
    _assert_caffes(net, x)
    assert relu_epilogues[0] == 0


def test_a_non_finite_param_keeps_caffes_relus(relu_epilogues):
    net = _finite_net()
    _assert_caffes(net, _x())
    with torch.no_grad():
        net.layer("a").bias[2] = float("nan")  # bumps its version
    _assert_caffes(net, _x())
    assert relu_epilogues[0] == 3  # only in the first run
    with torch.no_grad():
        net.layer("a").bias[2] = 0.0
    _assert_caffes(net, _x())
    assert relu_epilogues[0] == 6
    net.layer("c").weight.data[0, 0] = float("inf")  # a write no version shows (data_watch)
    _assert_caffes(net, _x())
    assert relu_epilogues[0] == 6


def test_a_fold_with_non_finite_weights_keeps_caffes_relus_from_there_on(relu_epilogues):
    """A variance below -eps: Caffe divides by the square root of a negative number."""
    net = _finite_net()
    with torch.no_grad():
        net.layer("bn").variance[3] = -1.0
    _assert_caffes(net, _x())
    assert relu_epilogues[0] == 1  # a's, before the fold


def test_relus_after_a_layer_that_can_make_nan_stay_after_the_product():
    log = FINITE.replace(
        'layer { name: "pool"',
        'layer { name: "log" type: "Log" bottom: "a" top: "a" }\nlayer { name: "pool"',
    )
    assert _net(log).optimized_program().finite_steps == 1  # a's alone
    lrn = FINITE.replace(
        'layer { name: "pool"',
        'layer { name: "n" type: "LRN" bottom: "a" top: "a" lrn_param { k: 0 } }\n'
        'layer { name: "pool"',
    )
    assert _net(lrn).optimized_program().finite_steps == 1  # k 0: 0 / 0 for zeros
    assert _net(lrn.replace("k: 0", "k: 1")).optimized_program().finite_steps == 3
    # a BatchNorm run alone (its top is asked for): a variance below -eps makes NaN
    apart = FINITE.split('layer { name: "bn"')[0] + APART
    net = _net(apart)
    alone = net.optimized_program(["c", "b", "n"])
    assert "BatchNorm" in [s.type for s in alone.steps]
    assert alone.finite_steps == 1  # a's alone
    assert net.optimized_program(["c", "n"]).finite_steps == 2  # into b; Scale alone
    assert net.optimized_program(["c"]).finite_steps == 3  # all into b


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # the layers' shape logic
def test_a_jit_trace_reads_no_values_to_pick_its_relus(monkeypatch):
    """The finite-run check converts tensors to bools: in a trace (the legacy ONNX exporter)
    that is a baked-in decision and a TracerWarning; the traced ReLUs are torch's anyway."""

    def no_check(self, blobs, program):
        raise AssertionError("checked values under torch.jit.trace")

    monkeypatch.setattr(torchcaffe.TorchNet, "_finite_run", no_check)
    net = _finite_net()
    x = _x()
    with torch.no_grad():
        traced = torch.jit.trace(net, (x,), strict=False, check_trace=False)
        got = traced(x)["c"]
    _assert_close(got, _unoptimized(net, x)["c"])
