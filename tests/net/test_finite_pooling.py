"""finite_pooling (torchcaffe/net/passes/finite_pooling.py): a one-top MAX Pooling that sees
only finite values in a finite run pools without its NaN check, and keeps Caffe's values
whenever the run is not finite (NaN never wins a window, as in Caffe)."""

from __future__ import annotations

import numpy as np
import torch
from google.protobuf import text_format

import torchcaffe
from torchcaffe.ops.pooling import PoolingLayer
from torchcaffe.proto import caffe_pb2

from ..helpers.counting import count_calls
from ..helpers.params import fill_params

PASS = "finite_pooling"

NET = """
input: "data" input_shape { dim: 2 dim: 3 dim: 9 dim: 9 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 6 kernel_size: 3 pad: 1 } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "pool" type: "Pooling" bottom: "c" top: "p"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "p" top: "f" inner_product_param { num_output: 4 } }
"""


def _net(text: str = NET) -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="test")
    fill_params(net, lambda t, gen: torch.rand(t.shape, generator=gen) - 0.3, seed=5)
    return net.eval()


def _assert_caffes(got: torch.Tensor, want: torch.Tensor) -> None:
    """Caffe's values, NaN where Caffe has NaN (the convolution's rounding aside)."""
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6, equal_nan=True)


def _both(net: torchcaffe.TorchNet, x: torch.Tensor) -> tuple[dict, dict]:
    """Every blob, optimized and not (the literal layer-by-layer program)."""
    with torch.inference_mode():
        got = net.forward_all_blobs(data=x)
        net.optimize = False
        try:
            want = net.forward_all_blobs(data=x)
        finally:
            net.optimize = True
    return got, want


def test_max_pooling_after_finite_layers_skips_its_check_in_a_finite_run(monkeypatch):
    net = _net()
    program = net.optimized_program()
    assert program.report[PASS] == 1 and program.finite_steps >= 1
    unchecked = count_calls(monkeypatch, PoolingLayer, "forward_finite")
    checks = count_calls(monkeypatch, torch.Tensor, "amin")  # the NaN check's read
    x = torch.randn(2, 3, 9, 9)
    with torch.inference_mode():
        got = net(data=x)["f"]
    assert unchecked[0] == 1 and checks[0] == 0
    _, want = _both(net, x)
    np.testing.assert_allclose(got.numpy(), want["f"].numpy(), rtol=1e-5, atol=1e-6)


def test_a_run_that_is_not_finite_keeps_caffes_max(monkeypatch):
    """A NaN input makes NaN tops after the convolution: torch's pooling would let NaN win
    its windows; Caffe's never selects it."""
    net = _net()
    unchecked = count_calls(monkeypatch, PoolingLayer, "forward_finite")
    checks = count_calls(monkeypatch, torch.Tensor, "amin")
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.randn(2, 3, 9, 9)
        x[0, :, 2, 2] = bad
        got, want = _both(net, x)
        assert unchecked[0] == 0 and checks[0] > 0
        assert torch.isnan(want["c"]).any() or torch.isinf(want["c"]).any()
        _assert_caffes(got["p"], want["p"])


def test_pooling_after_a_layer_that_makes_nan_keeps_its_check():
    log = NET.replace(
        'layer { name: "pool"',
        'layer { name: "log" type: "Log" bottom: "c" top: "c" }\nlayer { name: "pool"',
    ).replace('layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }\n', "")
    net = _net(log)
    assert net.optimized_program().report[PASS] == 0
    x = torch.randn(2, 3, 9, 9)  # log of the negative conv outputs: NaN
    got, want = _both(net, x)
    assert torch.isnan(want["c"]).any()
    _assert_caffes(got["p"], want["p"])


def test_mask_tops_and_average_pooling_are_left_alone():
    mask = NET.replace('top: "p"\n', 'top: "p" top: "m"\n')
    ave = NET.replace("pool: MAX", "pool: AVE")
    for text in (mask, ave):
        assert _net(text).optimized_program().report[PASS] == 0


def test_a_mask_asked_for_over_finite_values_is_still_caffes():
    """A window of -FLT_MAX alone (finite values) has no winner in Caffe: its mask is -1."""
    from torchcaffe.ops.pooling import FLT_MAX, PP, caffe_pool2d

    x = torch.full((1, 2, 4, 4), -FLT_MAX).contiguous(memory_format=torch.channels_last)
    x[0, 0, 0, 0] = 1.0
    y, mask = caffe_pool2d(x, PP.MAX, (2, 2), (2, 2), (0, 0), (2, 2), want_mask=True, finite=True)
    assert y[0, 0, 0, 0] == 1.0 and mask[0, 0, 0, 0] == 0
    assert (mask[0, 1] == -1).all() and (y[0, 1] == -FLT_MAX).all()
