"""channels_last_layout (torchcaffe/net/passes/layout.py): which convolutions it moves to
channels_last, that every other reader still sees NCHW, and that values do not change."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from google.protobuf import text_format

import torchcaffe
from torchcaffe.net.passes import layout
from torchcaffe.ops import onednn_conv, onednn_linear
from torchcaffe.ops.convolution import conv2d
from torchcaffe.ops.onednn_conv import PackedConvWeight
from torchcaffe.proto import caffe_pb2

from ..helpers.counting import count_calls, counting
from ..helpers.params import fill_params

LAYOUT = "channels_last_layout"
CL = torch.channels_last

# rgb conv (3 channels, channels_last as any other) -> pool -> Split into a dense 3x3 conv
# and a depthwise conv -> Eltwise -> 1x1 conv -> InnerProduct (reads NCHW) and Softmax over
# the conv output.
NET = """
input: "data" input_shape { dim: 2 dim: 3 dim: 32 dim: 32 }
layer { name: "rgb" type: "Convolution" bottom: "data" top: "a"
  convolution_param { num_output: 16 kernel_size: 3 pad: 1 } }
layer { name: "relu" type: "ReLU" bottom: "a" top: "a" }
layer { name: "pool" type: "Pooling" bottom: "a" top: "p"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "dense" type: "Convolution" bottom: "p" top: "d"
  convolution_param { num_output: 16 kernel_size: 3 pad: 1 } }
layer { name: "dw" type: "Convolution" bottom: "p" top: "w"
  convolution_param { num_output: 16 kernel_size: 3 pad: 1 group: 16 } }
layer { name: "sum" type: "Eltwise" bottom: "d" bottom: "w" top: "s" }
layer { name: "pw" type: "Convolution" bottom: "s" top: "q"
  convolution_param { num_output: 8 kernel_size: 1 } }
layer { name: "ip" type: "InnerProduct" bottom: "q" top: "f" inner_product_param { num_output: 5 } }
layer { name: "prob" type: "Softmax" bottom: "q" top: "sm" }
"""


def _net() -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(NET, caffe_pb2.NetParameter()), phase="test")
    fill_params(net, lambda t, gen: torch.randn(t.shape, generator=gen) * 0.3)
    return net


def _reference(net: torchcaffe.TorchNet, x: torch.Tensor) -> dict[str, torch.Tensor]:
    net.optimize = False
    try:
        with torch.inference_mode():
            return net(data=x)
    finally:
        net.optimize = True


def test_convolutions_and_pools_get_channels_last_and_others_nchw():
    program = _net().optimized_program()
    keys = {s.key.split("+")[0]: s.key for s in program.steps}
    assert program.report[LAYOUT] == 5  # rgb (3 channels too), pool, dense, dw, pw
    assert keys["rgb"].endswith("+nhwc") and keys["pool"].endswith("+nhwc")
    assert keys["dense"].endswith("+nhwc") and keys["dw"].endswith("+nhwc")
    assert keys["pw"].endswith("+nhwc")
    assert keys["ip"].endswith("+nchw") and keys["prob"].endswith("+nchw")
    assert not any(s.type == "Split" for s in program.steps)  # bypassed: none observed
    # observed, a Split's tops of a channels_last blob are that tensor itself
    everything = _net().optimized_program(_net().blob_names)
    splits = {s.bottoms[0]: s.key for s in everything.steps if s.type == "Split"}
    assert splits["q"].endswith("+shared") and splits["p"].endswith("+shared")


@pytest.mark.parametrize("dtype, channels_last", [(torch.float32, True), (torch.float64, False)])
def test_float64_runs_in_nchw(dtype, channels_last, monkeypatch):
    """oneDNN has no float64 kernels, and torch runs a channels_last float64 depthwise
    convolution as a loop over its groups: float64 bottoms keep their NCHW layout."""
    from torchcaffe.ops.convolution import ConvolutionLayer

    net = _net().to(dtype)
    layouts: list[bool] = []

    def compute(self, x, *args, **kwargs):
        layouts.append(x.is_contiguous(memory_format=CL) and not x.is_contiguous())
        return real(self, x, *args, **kwargs)

    real = ConvolutionLayer.compute
    monkeypatch.setattr(ConvolutionLayer, "compute", compute)
    x = torch.randn(2, 3, 32, 32, dtype=dtype)
    want = _reference(net, x)
    layouts.clear()
    with torch.inference_mode():
        got = net(data=x)
    assert layouts and all(seen == channels_last for seen in layouts), layouts
    torch.testing.assert_close(got["sm"], want["sm"], rtol=1e-5, atol=1e-6)


def test_outputs_match_the_unoptimized_net_and_are_contiguous(monkeypatch):
    monkeypatch.setattr(layout, "MIN_PIXELS", 0)  # every convolution in channels_last
    net = _net()
    x = torch.randn(2, 3, 32, 32)
    want = _reference(net, x)
    with torch.inference_mode():
        got = net(data=x)
        every = net.forward_all_blobs(data=x)
    for name in want:
        assert got[name].is_contiguous()
        # oneDNN sums in another order than torch's NCHW kernels: an InnerProduct output near
        # 0 that sums terms of ~100 differs by ~1e-4 (seen on an AVX2 host), so the absolute
        # tolerance follows the output's scale
        scale = float(want[name].abs().max())
        np.testing.assert_allclose(
            got[name].numpy(), want[name].numpy(), rtol=1e-5, atol=1e-6 * max(scale, 1.0)
        )
    assert all(t.is_contiguous() for t in every.values())


def test_with_packed_weights_every_dense_convolution_gets_channels_last(packs):
    """Packed for oneDNN a dense convolution is as fast or faster on channels_last at any
    size, so a small one (here 16x16 positions at batch 1, under MIN_PIXELS) gets it too,
    and runs packed."""
    program = _net().optimized_program()
    dense = program.runners[next(s.key for s in program.steps if s.key.startswith("dense"))]
    assert dense.always
    net = _net()
    with torch.inference_mode():
        net(data=torch.randn(1, 3, 32, 32))
    assert packs[0] >= 2  # rgb and dense at least (the depthwise one too)


def _seen_by(runner_wrapper: layout.ChannelsLastInput, x: torch.Tensor) -> torch.Tensor:
    seen: list[torch.Tensor] = []
    runner_wrapper.runner = lambda t: seen.append(t) or t
    runner_wrapper(x)
    return seen[0]


def test_dense_convolutions_switch_layout_by_input_positions():
    dense = layout.ChannelsLastInput(lambda t: t, always=False)
    big = torch.randn(1, 16, 28, 28)  # 784 positions: channels_last
    small = torch.randn(1, 16, 14, 14).contiguous(memory_format=CL)  # 196: back to NCHW
    assert _seen_by(dense, big).is_contiguous(memory_format=CL)
    assert not _seen_by(dense, big).is_contiguous()
    assert _seen_by(dense, small).is_contiguous()
    rgb = torch.randn(1, 3, 28, 28)  # 3 channels count as any other number
    assert _seen_by(dense, rgb).is_contiguous(memory_format=CL)


def test_strided_dense_convolutions_count_positions_at_their_stride():
    strided = layout.ChannelsLastInput(lambda t: t, always=False, stride=(2, 2))
    into_14x14 = torch.randn(1, 16, 28, 28).contiguous(memory_format=CL)  # 196 at stride 2
    into_28x28 = torch.randn(1, 16, 56, 55)  # 28 * 28 = 784 at stride 2 (rounded up)
    assert _seen_by(strided, into_14x14).is_contiguous()
    seen = _seen_by(strided, into_28x28)
    assert seen.is_contiguous(memory_format=CL) and not seen.is_contiguous()


def test_the_pass_gives_each_convolution_its_stride():
    strided = NET.replace(
        "num_output: 16 kernel_size: 3 pad: 1 }", "num_output: 16 kernel_size: 3 pad: 1 stride: 2 }"
    )
    strided = strided.replace("pad: 1 group: 16 }", "pad: 1 group: 16 stride: 2 }")
    net = torchcaffe.load(text_format.Parse(strided, caffe_pb2.NetParameter()), phase="test")
    program = net.optimized_program()
    runners = {s.key.split("+")[0]: program.runners[s.key] for s in program.steps}
    assert runners["dense"].stride == (2, 2) and runners["dw"].stride == (2, 2)
    assert runners["pw"].stride == (1, 1)


def test_pointwise_convolutions_keep_a_channels_last_input_at_any_size():
    pointwise = layout.ChannelsLastInput(lambda t: t, always=False, keep=True)
    small_cl = torch.randn(1, 16, 14, 14).contiguous(memory_format=CL)  # 196 positions
    assert _seen_by(pointwise, small_cl) is small_cl  # a dense 3x3 would get NCHW
    small = torch.randn(1, 16, 14, 14)
    assert _seen_by(pointwise, small).is_contiguous()  # nor is an NCHW one moved
    big = torch.randn(1, 16, 28, 28)
    assert not _seen_by(pointwise, big).is_contiguous()  # at 784 positions, as a dense one


def test_the_pass_lets_only_pointwise_convolutions_keep_their_layout():
    program = _net().optimized_program()
    runners = {s.key.split("+")[0]: program.runners[s.key] for s in program.steps}
    assert runners["pw"].keep
    assert not runners["dense"].keep and not runners["dw"].keep


def test_depthwise_convolutions_and_pooling_always_get_channels_last():
    always = layout.ChannelsLastInput(lambda t: t, always=True)
    seen = _seen_by(always, torch.randn(1, 16, 7, 7))
    assert seen.is_contiguous(memory_format=CL) and not seen.is_contiguous()
    rgb = torch.randn(1, 3, 32, 32)  # an RGB input too
    assert _seen_by(always, rgb).is_contiguous(memory_format=CL)


def test_tensors_off_the_cpu_are_left_alone():
    meta = torch.empty(1, 16, 56, 56, device="meta")
    assert _seen_by(layout.ChannelsLastInput(lambda t: t, always=True), meta) is meta


def test_programs_off_the_cpu_leave_the_pass_out(monkeypatch):
    # off the CPU the wrappers would only pass tensors through, at a host cost per layer
    net = _net()
    assert net.optimized_program().report[LAYOUT] == 5
    program = net.optimized_program(device=torch.device("meta"))
    assert LAYOUT not in program.report
    assert not any(s.key.endswith(("+nhwc", "+nchw")) for s in program.steps)
    calls = []
    wrapped = layout.ChannelsLastInput.__call__
    monkeypatch.setattr(
        layout.ChannelsLastInput, "__call__", lambda self, *b: calls.append(1) or wrapped(self, *b)
    )
    with torch.inference_mode():
        net(data=torch.randn(2, 3, 32, 32))
        assert len(calls) == 5
        net.to("meta")(data=torch.randn(2, 3, 32, 32, device="meta"))  # its inputs pick it
    assert len(calls) == 5


def test_split_tops_are_the_bottom_itself():
    x = torch.randn(1, 16, 5, 5).contiguous(memory_format=CL)
    tops = layout.SharedTops(3)(x)
    assert len(tops) == 3 and all(t is x for t in tops)


@pytest.mark.parametrize("bias", [True, False])
def test_pointwise_conv_of_channels_last_is_one_channels_last_gemm(bias):
    x = torch.randn(2, 24, 9, 7).contiguous(memory_format=CL)
    w, b = torch.randn(12, 24, 1, 1), torch.randn(12) if bias else None
    got = conv2d(x, w, b, (1, 1), (0, 0), (1, 1), 1)
    want = F.conv2d(x.contiguous(), w, b)
    assert got.is_contiguous(memory_format=CL) and not got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.fixture
def onednn_calls(monkeypatch):
    """How many products ran on oneDNN's matmul."""
    if onednn_linear._LINEAR is None:
        pytest.skip("this torch build has no oneDNN linear op")
    return count_calls(monkeypatch, onednn_linear, "_LINEAR")


@pytest.mark.parametrize("bias", [True, False])
def test_pointwise_conv_in_inference_adds_its_bias_in_onednns_epilogue(bias, onednn_calls):
    """addmm would first copy the bias into every output row: one more pass over the top."""
    x = torch.randn(2, 24, 9, 7).contiguous(memory_format=CL)
    w, b = torch.randn(12, 24, 1, 1), torch.randn(12) if bias else None
    want = F.conv2d(x.contiguous(), w, b)
    with torch.inference_mode():
        got = conv2d(x, w, b, (1, 1), (0, 0), (1, 1), 1)
    assert onednn_calls[0] == 1
    assert got.is_contiguous(memory_format=CL)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    w.requires_grad_()
    conv2d(x, w, b, (1, 1), (0, 0), (1, 1), 1).sum().backward()  # recorded: addmm's autograd
    assert onednn_calls[0] == 1
    assert w.grad is not None


@pytest.mark.parametrize("layout", [CL, torch.contiguous_format])
def test_pointwise_conv_over_one_pixel_is_one_gemm(layout, onednn_calls):
    """MobileNetV2's classifier (a 1x1 convolution over pooled 1x1 features): torch would
    send it to its im2col kernel."""
    x = torch.randn(3, 40, 1, 1).contiguous(memory_format=layout)
    w, b = torch.randn(30, 40, 1, 1), torch.randn(30)
    with torch.inference_mode():
        got = conv2d(x, w, b, (1, 1), (0, 0), (1, 1), 1)
    assert onednn_calls[0] == 1
    assert got.shape == (3, 30, 1, 1)
    torch.testing.assert_close(got, F.conv2d(x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", [CL, torch.contiguous_format])
def test_off_the_cpu_conv2d_is_torchs_own(layout, monkeypatch):
    # the GEMM forms are the CPU's; a GPU's runs are bound by the host's work per layer
    def no_gemm(*args):
        raise AssertionError("a CPU form off the CPU")

    monkeypatch.setattr(onednn_linear, "pixel_rows_product", no_gemm)
    w = torch.empty(30, 40, 1, 1, device="meta")
    for size in (1, 5):
        x = torch.empty(3, 40, size, size, device="meta").contiguous(memory_format=layout)
        with torch.inference_mode():
            assert conv2d(x, w, None, (1, 1), (0, 0), (1, 1), 1).shape == (3, 30, size, size)


def test_pass_is_a_no_op_without_convolutions():
    text = 'input: "x" input_shape { dim: 1 dim: 4 } '
    text += 'layer { name: "r" type: "ReLU" bottom: "x" top: "y" }'
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="test")
    assert net.optimized_program().report[LAYOUT] == 0


@pytest.fixture
def packs(monkeypatch):
    """How many times a convolution weight was packed for oneDNN."""
    if not onednn_conv.available():
        pytest.skip("this torch build has no oneDNN packed convolution")
    count = [0]
    pack, conv = onednn_conv._OPS
    monkeypatch.setattr(onednn_conv, "_OPS", (counting(pack, count), conv))
    return count


@pytest.mark.parametrize("groups", [1, 2, 8])
def test_inference_convolution_runs_on_the_packed_weight(packs, groups):
    x = torch.randn(1, 8, 7, 9).contiguous(memory_format=CL)
    w, b = torch.randn(16, 8 // groups, 3, 3), torch.randn(16)
    cache = PackedConvWeight()
    with torch.inference_mode():
        got = conv2d(x, w, b, (1, 2), (1, 0), (1, 1), groups, cache)
        again = conv2d(x, w, b, (1, 2), (1, 0), (1, 1), groups, cache)
        nchw = conv2d(x.contiguous(), w, b, (1, 2), (1, 0), (1, 1), groups, cache)
    assert packs[0] == 1  # packed once, reused; an NCHW bottom runs torch's own
    assert got.is_contiguous(memory_format=CL) and nchw.is_contiguous()
    want = F.conv2d(x.contiguous(), w, b, (1, 2), (1, 0), (1, 1), groups)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(again, got) and torch.equal(nchw, want)


@pytest.mark.parametrize("bias", [True, False])
def test_inference_pointwise_convolution_runs_on_the_packed_weight(bias, packs, onednn_calls):
    """A dense 1x1 convolution over a channels_last bottom: the packed convolution, not the
    GEMM over the plain weight (which runs where nothing is packed, as under autograd)."""
    x = torch.randn(2, 24, 9, 7).contiguous(memory_format=CL)
    w, b = torch.randn(12, 24, 1, 1), torch.randn(12) if bias else None
    cache = PackedConvWeight()
    want = F.conv2d(x.contiguous(), w, b)
    with torch.inference_mode():
        got = conv2d(x, w, b, (1, 1), (0, 0), (1, 1), 1, cache)
        leaky = conv2d(x, w, b, (1, 1), (0, 0), (1, 1), 1, cache, relu=0.25)
    assert packs[0] == 1 and onednn_calls[0] == 0
    assert got.is_contiguous(memory_format=CL)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(leaky, F.leaky_relu(want, 0.25), rtol=1e-5, atol=1e-5)
    w.requires_grad_()
    conv2d(x, w, b, (1, 1), (0, 0), (1, 1), 1, cache).sum().backward()
    assert packs[0] == 1 and onednn_calls[0] == 0  # recorded: addmm's autograd
    assert w.grad is not None


def test_the_packed_weight_follows_the_weight_and_the_input_shape(packs):
    cache = PackedConvWeight()
    w = torch.randn(8, 16, 3, 3)
    x = torch.randn(1, 16, 9, 9).contiguous(memory_format=CL)
    with torch.no_grad():
        conv2d(x, w, None, (1, 1), (1, 1), (1, 1), 1, cache)
        w.mul_(2)  # an edit (a new caffemodel, a solver step) bumps the version
        got = conv2d(x, w, None, (1, 1), (1, 1), (1, 1), 1, cache)
        assert packs[0] == 2
        torch.testing.assert_close(got, F.conv2d(x, w, None, 1, 1), rtol=1e-5, atol=1e-5)
        conv2d(x[:, :, :5], w, None, (1, 1), (1, 1), (1, 1), 1, cache)  # another shape
        assert packs[0] == 3
        w.data.mul_(2)  # bumps no version: what forget (TorchNet.params_changed) is for
        cache.forget()
        got = conv2d(x, w, None, (1, 1), (1, 1), (1, 1), 1, cache)
        torch.testing.assert_close(got, F.conv2d(x, w, None, 1, 1), rtol=1e-5, atol=1e-5)


@pytest.fixture
def checked(monkeypatch):
    """How many convolutions went through ``can_take``'s checks (a replay skips them)."""
    return count_calls(monkeypatch, onednn_conv, "can_take")


def test_a_repeated_convolution_replays_its_last_call(packs, checked):
    cache = PackedConvWeight()
    x = torch.randn(1, 16, 9, 9).contiguous(memory_format=CL)
    w, b = torch.randn(8, 16, 3, 3), torch.randn(8)
    geometry = ((1, 1), (1, 1), (1, 1), 1)
    with torch.no_grad():
        first = conv2d(x, w, b, *geometry, cache)
        again = conv2d(x, w, b, *geometry, cache, relu=0.5)
    assert checked[0] == 1 and packs[0] == 1
    torch.testing.assert_close(first, F.conv2d(x, w, b, 1, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, F.leaky_relu(first, 0.5), rtol=1e-6, atol=1e-6)


def test_the_packed_call_does_not_keep_its_weight_alive(packs):
    """A fold's weights are replaced after each param update: the old ones go at once, not
    when the layer next runs."""
    import weakref

    cache = PackedConvWeight()
    x = torch.randn(1, 16, 9, 9).contiguous(memory_format=CL)
    w = torch.randn(8, 16, 3, 3)
    gone = weakref.ref(w)
    with torch.no_grad():
        conv2d(x, w, None, (1, 1), (1, 1), (1, 1), 1, cache)
        conv2d(x, w, None, (1, 1), (1, 1), (1, 1), 1, cache)  # replayed
    del w
    assert gone() is None and packs[0] == 1
    with torch.no_grad():
        w2 = torch.randn(8, 16, 3, 3)
        got = conv2d(x, w2, None, (1, 1), (1, 1), (1, 1), 1, cache)
    assert packs[0] == 2
    torch.testing.assert_close(got, F.conv2d(x, w2, None, 1, 1), rtol=1e-5, atol=1e-5)


def _changed_calls(x, w, b):
    """Calls that differ from the one before in what the replay must see, with their
    expected values: each runs ``conv2d``'s checks again."""
    other_bias = torch.randn(8)
    yield lambda: w.mul_(2), (x, w, b)  # the weight written in place
    yield lambda: None, (x, w, other_bias)  # another bias
    yield lambda: None, (x.contiguous(), w, other_bias)  # an NCHW bottom: torch's own
    yield lambda: None, (x[:, :, :7].contiguous(memory_format=CL), w, other_bias)
    yield lambda: None, (x, w.clone(), other_bias)  # another weight


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # mkldnn.flags sets it too
def test_a_convolution_replays_only_the_same_call(packs, checked):
    cache = PackedConvWeight()
    x = torch.randn(1, 16, 9, 9).contiguous(memory_format=CL)
    w, b = torch.randn(8, 16, 3, 3), torch.randn(8)
    with torch.no_grad():
        conv2d(x, w, b, (1, 1), (1, 1), (1, 1), 1, cache)
        for n, (change, (x2, w2, b2)) in enumerate(_changed_calls(x, w, b), 2):
            change()
            got = conv2d(x2, w2, b2, (1, 1), (1, 1), (1, 1), 1, cache)
            assert checked[0] == n
            want = F.conv2d(x2, w2, b2, 1, 1)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        x, w = x2, w2
        conv2d(x, w, b2, (2, 2), (1, 1), (1, 1), 1, cache)  # another geometry
        assert checked[0] == n + 1
        with torch.enable_grad():  # nothing requires grad: autograd records nothing
            conv2d(x, w, b2, (2, 2), (1, 1), (1, 1), 1, cache)
        assert checked[0] == n + 1
        with torch.enable_grad():  # autograd records (the bias): the checks decide
            conv2d(x, w, b2.requires_grad_(), (2, 2), (1, 1), (1, 1), 1, cache)
        b2.requires_grad_(False)
        assert checked[0] == n + 2
        with torch.backends.mkldnn.flags(enabled=False):
            got = conv2d(x, w, b2, (2, 2), (1, 1), (1, 1), 1, cache)
        assert checked[0] == n + 3
        torch.testing.assert_close(got, F.conv2d(x, w, b2, 2, 1), rtol=1e-5, atol=1e-5)


# a folded convolution (+ ReLU), a plain one (+ leaky ReLU), and one whose 2x2 bottom gets
# an extra zero row and column (C's division gives it one output where torch's gives none)
REPLAYED = """
input: "data" input_shape { dim: 1 dim: 4 dim: 9 dim: 9 }
layer { name: "c1" type: "Convolution" bottom: "data" top: "a"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "bn" type: "BatchNorm" bottom: "a" top: "a" }
layer { name: "sc" type: "Scale" bottom: "a" top: "a" scale_param { bias_term: true } }
layer { name: "r1" type: "ReLU" bottom: "a" top: "a" }
layer { name: "c2" type: "Convolution" bottom: "a" top: "b"
  convolution_param { num_output: 8 kernel_size: 3 stride: 4 } }
layer { name: "r2" type: "ReLU" bottom: "b" top: "b" relu_param { negative_slope: 0.1 } }
layer { name: "c3" type: "Convolution" bottom: "b" top: "c"
  convolution_param { num_output: 4 kernel_size: 3 stride: 2 } }
layer { name: "r3" type: "ReLU" bottom: "c" top: "c" }
"""


def test_inference_steps_replay_their_packed_calls(packs, checked, monkeypatch):
    """A second forward makes each convolution's packed call again, skipping the fold's
    and the layer's own paths, with the same values; a param edit is still seen."""
    from torchcaffe.net.passes.folding import FoldedAffine
    from torchcaffe.ops.convolution import ConvolutionLayer

    param = text_format.Parse(REPLAYED, caffe_pb2.NetParameter())
    net = torchcaffe.load(param, phase="test")
    fill_params(net, lambda t, gen: torch.rand(t.shape, generator=gen) + 0.5)
    x = torch.randn(1, 4, 9, 9)
    want = _reference(net, x)["c"]
    assert want.shape == (1, 4, 1, 1)  # c3's 2x2 bottom was padded to 3x3
    with torch.inference_mode():
        first = net(data=x)["c"]
    assert packs[0] == 3
    slow = [0]
    for cls, name in ((FoldedAffine, "run_folded"), (ConvolutionLayer, "compute")):
        monkeypatch.setattr(cls, name, counting(getattr(cls, name), slow))
    checks = checked[0]
    with torch.inference_mode():
        again = net(data=x)["c"]
    # only c3's bottom, padded first, takes the layer's path, which replays on the padded one
    assert slow[0] == 1 and checked[0] == checks and packs[0] == 3
    torch.testing.assert_close(first, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(again, first)
    with torch.no_grad():
        net.layer("sc").weight.mul_(2)
        net.layer("c2").bias.add_(1)
    want = _reference(net, x)["c"]
    with torch.inference_mode():
        got = net(data=x)["c"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert packs[0] == 4  # the fold's new weight; c2's bias is read on each call


def test_a_net_moved_off_the_cpu_asks_no_packed_call_to_replay(monkeypatch):
    """The packed calls a CPU run left are for the CPU: a run elsewhere (a GPU's, bound by
    the host's work per layer; the meta device here) goes to its convolution without asking
    them, in the layer, the fold and ``conv2d`` alike."""
    param = text_format.Parse(REPLAYED, caffe_pb2.NetParameter())
    net = torchcaffe.load(param, phase="test")
    x = torch.randn(1, 4, 9, 9)
    with torch.inference_mode():
        net(data=x)  # packs and keeps each convolution's call
    asked: list[str] = []
    replay = PackedConvWeight.replay

    def counted(self, x, *args, **kwargs):
        asked.append(x.device.type)
        return replay(self, x, *args, **kwargs)

    monkeypatch.setattr(PackedConvWeight, "replay", counted)
    with torch.inference_mode():
        net(data=x)
    assert asked and set(asked) == {"cpu"}
    asked.clear()
    net.to("meta")
    with torch.inference_mode():
        got = net(data=x.to("meta"))["c"]
    assert got.shape == (1, 4, 1, 1) and not asked


def test_a_recorded_convolution_runs_torchs_own(packs):
    """Autograd records F.conv2d (the gradient must reach the weight); float64 too."""
    x = torch.randn(1, 16, 9, 9).contiguous(memory_format=CL)
    w = torch.randn(8, 16, 3, 3, requires_grad=True)
    y = conv2d(x, w, None, (1, 1), (1, 1), (1, 1), 1, PackedConvWeight())
    y.sum().backward()
    assert w.grad is not None and packs[0] == 0
    with torch.no_grad():
        conv2d(x.double(), w.double(), None, (1, 1), (1, 1), (1, 1), 1, PackedConvWeight())
    assert packs[0] == 0


def test_a_net_that_ran_inference_can_be_deep_copied(packs):
    """The packed weight is oneDNN's opaque tensor, which has no storage to copy: a copy of
    the net starts without it and packs again."""
    import copy

    net = _net()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        want = net(data=x)
    twin = copy.deepcopy(net)
    with torch.inference_mode():
        got = twin(data=x)
    for name in want:
        assert torch.equal(got[name], want[name])


def test_a_net_built_under_inference_mode_runs_without_caches():
    """Its params are inference tensors, which keep no version counter: nothing derived from
    them (packed or folded weights) can be kept, so each run derives them afresh."""
    text = NET.replace(
        'layer { name: "relu"',
        'layer { name: "bn" type: "BatchNorm" bottom: "a" top: "a" '
        "batch_norm_param { use_global_stats: true } }\n"
        'layer { name: "relu"',
    )
    param = text_format.Parse(text, caffe_pb2.NetParameter())
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        net = torchcaffe.load(param, phase="test")
        fill_params(net, lambda t, gen: torch.rand(t.shape, generator=gen) + 0.5)
        got = net(data=x)
        assert net.optimized_program().report["fold_batchnorm_scale_into_producer"] == 1
    ref = torchcaffe.load(param, phase="test")
    ref.load_state_dict(net.state_dict())
    with torch.inference_mode():
        want = ref(data=x)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5)
