"""Forward mode (``jvp``) of the autograd.Functions that carry Caffe's own backward.

Each is called directly, so the test reaches the ones a net uses only while autograd records
(an in-place Eltwise, the unstable PROD, an in-place neuron), which torch.func's jvp of a net
in eval mode never meets. Where Caffe's backward is linear in the top diff, forward mode is its
transpose: <jvp(t), g> == <t, vjp(g)>. In-place Eltwise's backward is not (bottom 0's diff is
PROD's factor squared), so its forward mode is its forward's own derivative, checked against a
central difference. The Functions autograd records on the CPU outside torch.func (LRN, MAX
pooling, oneDNN's linear) are reached by torch.autograd.forward_ad.
"""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import jvp, vjp

import torchcaffe
from torchcaffe.formats.prototxt import read_net
from torchcaffe.ops import onednn_linear
from torchcaffe.ops._functional.bn import stored_stats_batch_grad
from torchcaffe.ops._functional.clamped_log import log_clamped, log_softmax_clamped
from torchcaffe.ops._functional.contrastive import caffe_pair_distance
from torchcaffe.ops._functional.eltwise import CaffeUnstableProd, caffe_eltwise_in_place
from torchcaffe.ops._functional.lstm_unit import lstm_unit_step
from torchcaffe.ops._functional.multibox import divide_forward_only
from torchcaffe.ops._functional.mvn import caffe_mvn
from torchcaffe.ops._functional.normalize import caffe_normalize
from torchcaffe.ops._functional.power import caffe_power
from torchcaffe.ops._functional.relu6 import caffe_relu6
from torchcaffe.ops._functional.smooth_l1 import weighted_smooth_l1_fork
from torchcaffe.ops._functional.unpool import segnet_unpool
from torchcaffe.ops._transforms import with_jvp
from torchcaffe.ops.lrn import AcrossChannelsLRN
from torchcaffe.ops.neuron import SlopeAtOutput
from torchcaffe.ops.pooling import _FlooredMaxPool2d

IN_PLACE_ELU = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 5 } } }
layer { name: "elu" type: "ELU" bottom: "data" top: "data" elu_param { alpha: 0.7 } }
"""


def _elu_at_output(x: torch.Tensor) -> torch.Tensor:
    net = torchcaffe.load(read_net(IN_PLACE_ELU))
    layer = net.layer("elu")
    assert layer.in_place_slope and not layer.slope_overwrites_top_diff
    return with_jvp(SlopeAtOutput).apply(x, layer)


_GEN = torch.Generator().manual_seed(0)  # the cases' values, made when the module is imported


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_GEN, dtype=torch.float64)


# (the function of the differentiated tensors, those tensors)
FUNCTIONS = {
    "power": (lambda x: caffe_power(x, 3.0, 0.5, 1.0), [_rand(4, 5)]),
    "power_no_shift": (lambda x: caffe_power(x, 2.5, 1.0, 0.0), [_rand(4, 5).abs() + 0.5]),
    "relu6": (lambda x: caffe_relu6(x * 4, 0.1, 6.0), [_rand(4, 5)]),
    "mvn": (lambda x: caffe_mvn(x, 1e-9), [_rand(4, 7)]),
    "mvn_in_place": (lambda x: caffe_mvn(x, 1e-9, in_place=True), [_rand(4, 7)]),
    "normalize_across_spatial": (
        lambda x, s: caffe_normalize(x, s, True, 1e-10),
        [_rand(2, 3, 4), _rand(3)],
    ),
    "normalize_per_position": (
        lambda x, s: caffe_normalize(x, s, False, 1e-10),
        [_rand(2, 3, 4), _rand(3)],
    ),
    "normalize_shared_scale": (
        lambda x, s: caffe_normalize(x, s, True, 1e-10),
        [_rand(2, 3, 4), _rand(())],
    ),
    "pair_distance": (lambda d: caffe_pair_distance(d.abs() + 0.1), [_rand(6)]),
    "log_softmax_clamped": (lambda x: log_softmax_clamped(x, 1, 1e-20)[0], [_rand(3, 5, 2)]),
    # most below the threshold, where Caffe's slope is 1 / threshold
    "log_clamped": (lambda p: log_clamped(p.abs() * 0.05 + 0.001, 0.05), [_rand(3, 5)]),
    # the Function itself (where forward mode runs, with its jvp): caffe_unstable_prod takes it
    # only where autograd records
    "unstable_prod": (
        lambda *bs: with_jvp(CaffeUnstableProd).apply(*bs),
        [_rand(3, 4), _rand(3, 4), _rand(3, 4)],
    ),
    "stored_stats_batch_grad": (
        lambda x: stored_stats_batch_grad(x, _MEAN, _INV_STD),
        [_rand(2, 3, 5)],
    ),
    "segnet_unpool": (
        lambda x: segnet_unpool(x, _INDEX, (3, 3)),
        [_rand(1, 2, 2, 2)],
    ),
    "weighted_smooth_l1_fork": (
        lambda d: weighted_smooth_l1_fork(d, _WEIGHTS, 1.0),
        [_rand(4, 5) * 2],
    ),
    "lstm_unit": (
        lambda c, x: torch.cat(lstm_unit_step(c, x, _CONT), dim=-1),
        [_rand(1, 3, 4), _rand(1, 3, 16)],
    ),
    "divide_forward_only": (lambda x: divide_forward_only(x, _DIVISOR), [_rand(3, 4)]),
    "slope_at_output": (_elu_at_output, [_rand(2, 5)]),
}
_MEAN, _INV_STD = _rand(3, 1), _rand(3, 1).abs() + 0.5
# two bottom values land on one top position (index 4): the forward keeps the later one,
# Caffe's backward sends that position's diff to both
_INDEX = torch.tensor([[[[0, 4], [4, 8]], [[1, 2], [3, 5]]]])
_WEIGHTS = torch.tensor([1.0, 0.5, 2.0, 0.0, 1.0], dtype=torch.float64)
_CONT = torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64)
_DIVISOR = torch.tensor(4.0, dtype=torch.float64)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_forward_mode_is_the_backwards_transpose(name):
    fn, primals = FUNCTIONS[name]
    gen = torch.Generator().manual_seed(1)
    tangents = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in primals]
    _, out_t = jvp(fn, tuple(primals), tuple(tangents))
    out, back = vjp(fn, *primals)
    g = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    bars = back(g)
    forward = (out_t * g).sum()
    backward = sum((t * b).sum() for t, b in zip(tangents, bars))
    torch.testing.assert_close(forward, backward, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("op", ["SUM", "MAX", "PROD"])
def test_an_in_place_eltwises_forward_mode_is_its_forwards_derivative(op):
    gen = torch.Generator().manual_seed(2)
    bottoms = [torch.randn(3, 4, generator=gen, dtype=torch.float64) for _ in range(3)]
    tangents = [torch.randn(3, 4, generator=gen, dtype=torch.float64) for _ in range(3)]

    def eltwise(*bs):
        return caffe_eltwise_in_place(op, [0.5, 2.0, -1.0], False, *bs)

    _, got = jvp(eltwise, tuple(bottoms), tuple(tangents))
    eps = 1e-6
    ahead = eltwise(*[b + eps * t for b, t in zip(bottoms, tangents)])
    behind = eltwise(*[b - eps * t for b, t in zip(bottoms, tangents)])
    torch.testing.assert_close(got, (ahead - behind) / (2 * eps), rtol=1e-6, atol=1e-6)


def _lrn(x):
    return with_jvp(AcrossChannelsLRN).apply(x, 5, 0.1, 0.75, 1.0)


def _floored_max_pool(x):
    return with_jvp(_FlooredMaxPool2d).apply(x, (2, 2), (2, 2), (0, 0), False)[0]


def _onednn_linear(x, w, b):
    if onednn_linear._LINEAR is None:
        pytest.skip("this torch build has no oneDNN linear op")
    return with_jvp(onednn_linear._OneDnnLinear).apply(x, w, b)


def _with_floored_window() -> torch.Tensor:
    x = _rand(1, 2, 4, 4)
    x[0, 1, :2, :2] = float("-inf")  # a window whose best is floored at -FLT_MAX
    return x


# The Functions autograd records on the CPU, in Caffe's style (ctx in forward): torch.func
# takes torch's own ops instead, torch.autograd.forward_ad their jvp.
RECORDED = {
    "across_channels_lrn": (_lrn, [_rand(2, 7, 3, 3)]),
    "floored_max_pool": (_floored_max_pool, [_with_floored_window()]),
    "onednn_linear": (
        _onednn_linear,
        [torch.randn(3, 64), torch.randn(32, 64), torch.randn(32)],
    ),
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_forward_ad_of_a_recorded_function_is_its_backwards_transpose(name):
    fn, primals = RECORDED[name]
    gen = torch.Generator().manual_seed(3)
    tangents = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in primals]
    with fwAD.dual_level():
        duals = [fwAD.make_dual(p.clone().requires_grad_(), t) for p, t in zip(primals, tangents)]
        out_t = fwAD.unpack_dual(fn(*duals)).tangent
    leaves = [p.clone().requires_grad_() for p in primals]
    out = fn(*leaves)
    g = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    bars = torch.autograd.grad(out, leaves, g)
    forward = (out_t.double() * g.double()).sum()
    backward = sum((t.double() * b.double()).sum() for t, b in zip(tangents, bars))
    tol = 1e-9 if primals[0].dtype == torch.float64 else 1e-4
    torch.testing.assert_close(forward, backward, rtol=tol, atol=tol)


GRAD_MODE_NET = """
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 1 dim: 3 dim: 17 dim: 17 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 16 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "norm" type: "LRN" bottom: "conv" top: "norm" lrn_param { local_size: 5 } }
layer { name: "pool" type: "Pooling" bottom: "norm" top: "pool"
        pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 1024 weight_filler { type: "xavier" } } }
"""


def test_forward_ad_through_a_net_whose_params_want_gradients():
    """With grad mode on, the net's params make autograd record LRN, MAX pooling and the
    InnerProduct through their Functions; torch.autograd.forward_ad's tangent is
    torch.func.jvp's (which takes torch's own ops)."""
    net = torchcaffe.load(read_net(GRAD_MODE_NET))
    x, t = torch.randn(1, 3, 17, 17), torch.randn(1, 3, 17, 17)
    with fwAD.dual_level():
        got = fwAD.unpack_dual(net(data=fwAD.make_dual(x, t))["ip"]).tangent
    _, want = jvp(lambda z: net(data=z)["ip"], (x,), (t,))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
