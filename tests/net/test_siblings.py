"""merge_sibling_convolutions (torchcaffe/net/passes/siblings.py): convolutions over one bottom
with one geometry and the same ReLU run as one convolution, every blob keeping the value the
layer-by-layer program gives it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from google.protobuf import text_format

import torchcaffe
from torchcaffe.net.passes import siblings
from torchcaffe.proto import caffe_pb2

from ..helpers.counting import count_calls
from ..helpers.params import fill_params
from ..helpers.programs import literal_blobs

PASS = "merge_sibling_convolutions"

# an inception module: three 1x1 branches over one bottom (one folded with BatchNorm + Scale,
# one without bias), a 3x3 branch after one of them, a pooling branch, a Concat
INCEPTION = """
input: "data" input_shape { dim: 2 dim: 6 dim: 9 dim: 9 }
layer { name: "pre" type: "Convolution" bottom: "data" top: "x"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "pre_relu" type: "ReLU" bottom: "x" top: "x" }
layer { name: "b1" type: "Convolution" bottom: "x" top: "b1"
  convolution_param { num_output: 5 kernel_size: 1 } }
layer { name: "b1_relu" type: "ReLU" bottom: "b1" top: "b1" }
layer { name: "b2r" type: "Convolution" bottom: "x" top: "b2r"
  convolution_param { num_output: 3 kernel_size: 1 bias_term: false } }
layer { name: "b2r_bn" type: "BatchNorm" bottom: "b2r" top: "b2r" }
layer { name: "b2r_sc" type: "Scale" bottom: "b2r" top: "b2r" scale_param { bias_term: true } }
layer { name: "b2r_relu" type: "ReLU" bottom: "b2r" top: "b2r" }
layer { name: "b2" type: "Convolution" bottom: "b2r" top: "b2"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "b2_relu" type: "ReLU" bottom: "b2" top: "b2" }
layer { name: "b3" type: "Convolution" bottom: "x" top: "b3"
  convolution_param { num_output: 2 kernel_size: 1 bias_term: false } }
layer { name: "b3_relu" type: "ReLU" bottom: "b3" top: "b3" }
layer { name: "pool" type: "Pooling" bottom: "x" top: "p"
  pooling_param { pool: MAX kernel_size: 3 stride: 1 pad: 1 } }
layer { name: "cat" type: "Concat" bottom: "b1" bottom: "b2" bottom: "b3" bottom: "p" top: "out" }
"""


def _net(text: str = INCEPTION) -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="test")

    def values(t, gen):  # weights around 0, BatchNorm's statistics and scales positive
        v = torch.rand(t.shape, generator=gen) * 1.5 + 0.25
        return v - 1.0 if t.dim() > 1 else v

    fill_params(net, values, seed=3)
    return net.eval()


def _observed(net: torchcaffe.TorchNet, x: torch.Tensor, names: list[str]) -> dict:
    """The optimized inference run's ``names`` (the blobs it observes: a Split's tops, which
    ``forward_all_blobs`` observes too, would keep the siblings apart)."""
    program = net.optimized_program(names)
    with torch.inference_mode():
        blobs = net.run(net.bind_inputs((), {"data": x}), program=program)
    return {name: blobs[name] for name in names}


def _assert_all_blobs_match(net: torchcaffe.TorchNet, x: torch.Tensor) -> None:
    """Every blob but the Splits' tops, optimized and not; the siblings did merge."""
    want = literal_blobs(net, x)
    names = [n for n in want if "_split_" not in n]
    assert net.optimized_program(names).report[PASS] >= 1
    got = _observed(net, x, names)
    for name in names:
        np.testing.assert_allclose(
            got[name].numpy(), want[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name
        )


def _counted_convolutions(monkeypatch) -> list[int]:
    """The stacked convolutions the groups run (``siblings.conv2d``)."""
    return count_calls(monkeypatch, siblings, "conv2d")


def test_three_branches_over_one_bottom_run_as_one_convolution(monkeypatch):
    net = _net()
    program = net.optimized_program()
    assert program.report[PASS] == 1
    (group,) = [s for s in program.steps if "+siblings" in s.key]
    assert group.tops == ("b1", "b2r", "b3")
    assert group.type == "Convolution+ReLU+Convolution+BatchNorm+Scale+ReLU+Convolution+ReLU"
    stacked = _counted_convolutions(monkeypatch)
    x = torch.randn(2, 6, 9, 9)
    with torch.inference_mode():
        got = net(data=x)["out"]
    assert stacked[0] == 1
    np.testing.assert_allclose(
        got.numpy(), literal_blobs(net, x)["out"].numpy(), rtol=1e-5, atol=1e-6
    )


def test_every_blob_keeps_its_value_in_both_layouts():
    net = _net()
    for batch in (1, 2):
        _assert_all_blobs_match(net, torch.randn(batch, 6, 9, 9))
    tops = _observed(net, torch.randn(1, 6, 9, 9), ["b1", "b2r", "b3", "out"])
    for name in ("b1", "b2r", "b3"):  # dense, channels_last as the bottom: no channel slice
        assert tops[name].is_contiguous(memory_format=torch.channels_last), name
        assert tops[name].stride(1) == 1 and tops[name].stride(0) == tops[name][0].numel()


def test_the_stacked_weights_follow_the_params():
    net = _net()
    x = torch.randn(1, 6, 9, 9)
    _assert_all_blobs_match(net, x)  # the group stacks the weights as they are
    with torch.no_grad():  # versions bumped: the group sees it itself
        net.layer("b1").weight.mul_(-2.0)
        net.layer("b2r_bn").variance.mul_(3.0)
    _assert_all_blobs_match(net, x)
    with torch.no_grad():
        net.layer("b3").weight.data.copy_(torch.rand(2, 8, 1, 1))  # no version bump
        net.layer("b2r_bn").variance.data.mul_(0.5)  # a member's fold reads it
    net.params_changed()
    _assert_all_blobs_match(net, x)


def test_a_write_that_bumps_no_version_is_followed_after_params_changed():
    """Siblings without a fold (whose own weights ``params_changed`` folds again)."""
    unfolded = "\n".join(
        line for line in INCEPTION.splitlines() if "b2r_bn" not in line and "b2r_sc" not in line
    )
    net = _net(unfolded)
    x = torch.randn(1, 6, 9, 9)
    _assert_all_blobs_match(net, x)
    with torch.no_grad():
        net.layer("b3").weight.data.copy_(torch.rand(2, 8, 1, 1))
        net.layer("b1").bias.data.fill_(0.5)
    net.params_changed()
    _assert_all_blobs_match(net, x)


def test_a_nan_folded_weight_keeps_caffes_relu():
    """A BatchNorm variance below -eps folds into NaN weights: the group's ReLU must then
    keep NaN (Caffe's max(x, 0)), not run in oneDNN's epilogue, which makes it 0."""
    net = _net()
    with torch.no_grad():
        net.layer("b2r_bn").variance.fill_(-5.0)
    x = torch.randn(1, 6, 9, 9)
    want = literal_blobs(net, x)
    got = _observed(net, x, ["b1", "b2r", "b3", "out"])
    assert torch.isnan(want["b2r"]).all()
    for name in ("b1", "b2r", "b3", "out"):
        np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), rtol=1e-5, atol=1e-6)


def test_an_infinite_folded_member_keeps_caffes_infinities():
    """A member whose fold is not finite runs its chain layer by layer (stacked, its +-inf
    filter would sum to NaN where Caffe's Scale gives +-inf), and the others as they are."""
    net = _net()
    with torch.no_grad():
        net.layer("b2r_sc").weight[0] = float("inf")
    x = torch.randn(1, 6, 9, 9)
    want = literal_blobs(net, x)
    got = _observed(net, x, ["b1", "b2r", "b3", "out"])
    assert torch.isinf(want["b2r"][:, 0]).any() and not torch.isnan(want["b2r"]).any()
    for name in ("b1", "b2r", "b3", "out"):
        np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), rtol=1e-5, atol=1e-6)


def test_a_nan_weight_of_a_member_keeps_caffes_relu():
    """The finite-run check reads the members' own weights (an unfolded member's NaN reaches
    its ReLU, which oneDNN's epilogue would make 0)."""
    net = _net()
    with torch.no_grad():
        net.layer("b1").weight[0, 0] = float("nan")
    x = torch.randn(1, 6, 9, 9)
    want = literal_blobs(net, x)
    got = _observed(net, x, ["b1", "b2r", "b3", "out"])
    assert torch.isnan(want["b1"][:, 0]).all()
    for name in ("b1", "b2r", "b3", "out"):
        np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "change",
    [
        # another geometry (3x3 instead of 1x1)
        ("num_output: 2 kernel_size: 1", "num_output: 2 kernel_size: 3 pad: 1"),
        # another ReLU (leaky)
        ('bottom: "b3" top: "b3" }', 'bottom: "b3" top: "b3" relu_param { negative_slope: 0.5 } }'),
    ],
)
def test_siblings_that_differ_are_not_merged(change):
    """b1 and b2r still merge; b3 differs from both."""
    old, new = change
    assert old in INCEPTION
    net = _net(INCEPTION.replace(old, new))
    program = net.optimized_program()
    (group,) = [s for s in program.steps if "+siblings" in s.key]
    assert group.tops == ("b1", "b2r")
    _assert_all_blobs_match(net, torch.randn(2, 6, 9, 9))


def test_grouped_convolutions_are_left_alone():
    text = INCEPTION.replace("output: 5 kernel_size: 1 }", "output: 4 kernel_size: 1 group: 2 }")
    net = _net(text)
    (group,) = [s for s in net.optimized_program().steps if "+siblings" in s.key]
    assert group.tops == ("b2r", "b3")
    _assert_all_blobs_match(net, torch.randn(2, 6, 9, 9))


def test_a_large_bottom_runs_each_sibling(monkeypatch):
    """Past MAX_POSITIONS bottom positions the members run one by one (same values)."""
    net = _net()
    stacked = _counted_convolutions(monkeypatch)
    monkeypatch.setattr(siblings, "MAX_POSITIONS", 2 * 9 * 9 - 1)
    _assert_all_blobs_match(net, torch.randn(2, 6, 9, 9))
    assert stacked[0] == 0
    _assert_all_blobs_match(net, torch.randn(1, 6, 9, 9))
    assert stacked[0] == 1


def test_a_traced_run_calls_each_sibling(monkeypatch):
    """Under torch.jit's tracer (as under torch.compile) each member runs as before."""
    net = _net()
    stacked = _counted_convolutions(monkeypatch)
    x = torch.randn(1, 6, 9, 9)
    with torch.no_grad():
        traced = torch.jit.trace(net, (x,), strict=False, check_trace=False)
    assert stacked[0] == 0
    np.testing.assert_allclose(
        traced(x)["out"].detach().numpy(),
        literal_blobs(net, x)["out"].numpy(),
        rtol=1e-5,
        atol=1e-6,
    )
