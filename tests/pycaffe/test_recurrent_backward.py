"""RNN and LSTM through the Caffe face: which bottom diffs their Backward writes.

Caffe's recurrent layers backpropagate inside an unrolled net whose transforms of x and
x_static say ``propagate_down: true``, and bottom[0] (and x_static) share their diff with
that net's inputs: whenever the layer runs Backward, those diffs are written, even where
the outer net needs no gradient there (no force_backward, or ``propagate_down: false``).
LSTMUnit's Backward writes both c_prev's and x's diffs when either is wanted.
"""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe as caffe

FILLER = "weight_filler { type: 'uniform' min: -0.5 max: 0.5 }"
NET = """
{force}
layer {{ name: "in" type: "Input" top: "x0" top: "cont" top: "xs" top: "label"
  input_param {{ shape {{ dim: 3 dim: 2 dim: 4 }} shape {{ dim: 3 dim: 2 }}
                shape {{ dim: 2 dim: 5 }} shape {{ dim: 3 dim: 2 }} }} }}
layer {{ name: "enc" type: "InnerProduct" bottom: "x0" top: "x"
  inner_product_param {{ num_output: 3 axis: 2 {filler} }} }}
layer {{ name: "rec" type: "{kind}" bottom: "x" bottom: "cont" bottom: "xs" top: "h"
  {propagate} recurrent_param {{ num_output: 3 {filler} }} }}
layer {{ name: "fc" type: "InnerProduct" bottom: "h" top: "fc"
  inner_product_param {{ num_output: 4 axis: 2 {filler} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss"
  softmax_param {{ axis: 2 }} }}
"""


def _net(tmp_path, kind, name, force="", propagate=""):
    path = tmp_path / f"{name}.prototxt"
    path.write_text(NET.format(force=force, kind=kind, propagate=propagate, filler=FILLER))
    return caffe.Net(str(path), caffe.TRAIN)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_x_and_static_diffs_are_written_without_being_needed(tmp_path, kind):
    stopped = "propagate_down: false propagate_down: false propagate_down: false"
    net = _net(tmp_path, kind, "stopped", propagate=stopped)
    ref = _net(tmp_path, kind, "forced", force="force_backward: true")
    for name in net.params:
        for p, q in zip(net.params[name], ref.params[name]):
            q.data[...] = p.data
    rng = np.random.default_rng(0)
    feed = {
        "x0": rng.standard_normal((3, 2, 4)),
        "cont": np.array([[0, 0], [1, 1], [1, 0]]),
        "xs": rng.standard_normal((2, 5)),
        "label": rng.integers(0, 4, (3, 2)),
    }
    for n in (net, ref):
        for blob, value in feed.items():
            n.blobs[blob].data[...] = value
        n.forward()
        n.backward()
    for blob in ("x", "xs"):
        assert np.abs(ref.blobs[blob].diff).max() > 0
        np.testing.assert_array_equal(net.blobs[blob].diff, ref.blobs[blob].diff)
    # propagate_down: false still stops the gradient at the recurrent layer
    assert not net.params["enc"][0].diff.any()
    assert ref.params["enc"][0].diff.any()


def test_lstm_unit_writes_both_diffs_when_either_is_wanted(tmp_path):
    path = tmp_path / "unit.prototxt"
    path.write_text("""
layer { name: "in" type: "Input" top: "c0" top: "x0" top: "cont"
  input_param { shape { dim: 1 dim: 2 dim: 3 } shape { dim: 1 dim: 2 dim: 4 }
                shape { dim: 1 dim: 2 } } }
layer { name: "gates" type: "InnerProduct" bottom: "x0" top: "x"
  inner_product_param { num_output: 12 axis: 2 weight_filler { type: "gaussian" } } }
layer { name: "unit" type: "LSTMUnit" bottom: "c0" bottom: "x" bottom: "cont" top: "c" top: "h" }
layer { name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "c" top: "loss" }
""")
    net = caffe.Net(str(path), caffe.TRAIN)
    rng = np.random.default_rng(0)
    net.blobs["c0"].data[...] = rng.standard_normal((1, 2, 3))
    net.blobs["x0"].data[...] = rng.standard_normal((1, 2, 4))
    net.blobs["cont"].data[...] = 1
    net.forward()
    net.backward()
    c, h, c0 = (net.blobs[n].data.astype(np.float64) for n in ("c", "h", "c0"))
    x = net.blobs["x"].data.astype(np.float64)
    f = 1 / (1 + np.exp(-x[..., 3:6]))
    o = 1 / (1 + np.exp(-x[..., 6:9]))
    d = h - c  # EuclideanLoss over num = 1: dh = d, dc = -d
    c_term = -d + d * o * (1 - np.tanh(c) ** 2)
    np.testing.assert_allclose(net.blobs["c0"].diff, c_term * f, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_a_backward_before_any_forward_leaves_the_carried_state(tmp_path, kind):
    """Its replayed forward must not move the state the next forward starts from."""
    net = _net(tmp_path, kind, "early")
    fresh = _net(tmp_path, kind, "fresh")
    for name in net.params:
        for p, q in zip(net.params[name], fresh.params[name]):
            q.data[...] = p.data
    rng = np.random.default_rng(1)
    x0, xs = rng.standard_normal((3, 2, 4)), rng.standard_normal((2, 5))
    for n in (net, fresh):
        n.blobs["x0"].data[...] = x0
        n.blobs["cont"].data[...] = 1
        n.blobs["xs"].data[...] = xs
    net.backward()
    np.testing.assert_array_equal(net.forward()["loss"], fresh.forward()["loss"])
    np.testing.assert_array_equal(net.blobs["h"].data, fresh.blobs["h"].data)
