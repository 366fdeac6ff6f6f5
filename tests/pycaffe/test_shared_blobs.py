"""Blobs that share memory, as in Caffe: a Split top shares its bottom's data
(SplitLayer::Forward), a Flatten or Reshape top its bottom's data and diff (FlattenLayer's
Forward and Backward, ReshapeLayer::Reshape: Blob::ShareData / ShareDiff). pycaffe's arrays
wrap the one buffer, so writing either blob shows in the other, a layer in place on the top
writes the bottom, and a forward started past the sharing layer reads what a script wrote."""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe.pycaffe.net import Net

FILL = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "constant" value: 0.1 }'

# conv feeds a Flatten (with a ReLU in place on its top) and a Reshape: Caffe splits it, and
# conv, both split tops, flat and resh are one data memory
NET = f"""
name: "shared"
{{force}}
input: "data"
input_shape {{ dim: 2 dim: 3 dim: 4 dim: 4 }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param {{ num_output: 4 kernel_size: 3 {FILL} }} }}
layer {{ name: "flatten" type: "Flatten" bottom: "conv" top: "flat" }}
layer {{ name: "reshape" type: "Reshape" bottom: "conv" top: "resh"
  reshape_param {{ shape {{ dim: 0 dim: -1 }} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "flat" top: "flat" }}
layer {{ name: "ip" type: "InnerProduct" bottom: "flat" top: "ip"
  inner_product_param {{ num_output: 3 {FILL} }} }}
layer {{ name: "ip2" type: "InnerProduct" bottom: "resh" top: "ip2"
  inner_product_param {{ num_output: 3 {FILL} }} }}
"""
VIEWS = ("conv_conv_0_split_0", "conv_conv_0_split_1", "flat", "resh")


def make_net(tmp_path, force_backward: bool = False) -> Net:
    path = tmp_path / "net.prototxt"
    path.write_text(NET.replace("{force}", "force_backward: true" if force_backward else ""))
    caffe.set_random_seed(3)
    net = caffe.Net(str(path), caffe.TEST)
    rng = np.random.default_rng(0)
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
    return net


@pytest.mark.parametrize("force_backward", [False, True], ids=["inference", "recorded"])
def test_tops_are_the_bottoms_memory(tmp_path, force_backward):
    net = make_net(tmp_path, force_backward)
    net.forward()
    blobs = net.blobs
    conv = blobs["conv"].data
    for name in VIEWS:
        assert np.shares_memory(conv, blobs[name].data), name
    y = np.arange(conv.size, dtype=np.float32).reshape(conv.shape) - 7
    blobs["conv"].data[...] = y  # written through the bottom, read through the tops
    for name in VIEWS:
        np.testing.assert_array_equal(blobs[name].data.reshape(conv.shape), y, err_msg=name)
    z = -y.reshape(blobs["flat"].shape)
    blobs["flat"].data[...] = z  # and the other way
    np.testing.assert_array_equal(blobs["conv"].data, z.reshape(conv.shape))
    np.testing.assert_array_equal(blobs["resh"].data, z.reshape(blobs["resh"].shape))


@pytest.mark.parametrize("force_backward", [False, True], ids=["inference", "recorded"])
def test_in_place_layer_on_a_flatten_top_writes_the_bottom(tmp_path, force_backward):
    net = make_net(tmp_path, force_backward)
    net.forward(end="conv")
    before = net.blobs["conv"].data.copy()
    assert (before < 0).any()
    net.forward()  # the ReLU in place on flat writes conv's memory
    np.testing.assert_array_equal(net.blobs["conv"].data, np.maximum(before, 0))
    np.testing.assert_array_equal(net.blobs["resh"].data, np.maximum(before, 0).reshape(2, -1))


@pytest.mark.parametrize("force_backward", [False, True], ids=["inference", "recorded"])
def test_forward_from_a_reader_sees_a_write_of_the_shared_bottom(tmp_path, force_backward):
    net = make_net(tmp_path, force_backward)
    net.forward()
    y = np.linspace(-1, 1, net.blobs["conv"].count, dtype=np.float32)
    net.blobs["conv"].data[...] = y.reshape(net.blobs["conv"].shape)
    net.forward(start="ip", end="ip")  # ip reads flat: conv's memory
    w, b = (p.data for p in net.params["ip"])
    np.testing.assert_allclose(net.blobs["ip"].data, y.reshape(2, -1) @ w.T + b, rtol=1e-5)
    net.blobs["conv"].data[...] = y.reshape(net.blobs["conv"].shape)
    net.forward(start="relu")  # ReLU in place on flat, then ip2 reads resh: the same memory
    relu = np.maximum(y, 0).reshape(2, -1)
    np.testing.assert_array_equal(net.blobs["conv"].data.reshape(2, -1), relu)
    w2, b2 = (p.data for p in net.params["ip2"])
    np.testing.assert_allclose(net.blobs["ip2"].data, relu @ w2.T + b2, rtol=1e-5)


def test_reshape_and_flatten_share_diffs_split_tops_do_not(tmp_path):
    net = make_net(tmp_path, force_backward=True)
    net.forward()
    net.backward()  # FlattenLayer::Backward makes its bottom's diff the top's
    blobs = net.blobs
    for top, bottom in (("flat", "conv_conv_0_split_0"), ("resh", "conv_conv_0_split_1")):
        assert np.shares_memory(blobs[top].diff, blobs[bottom].diff)
        g = np.arange(blobs[top].count, dtype=np.float32).reshape(blobs[top].shape)
        blobs[top].diff[...] = g
        np.testing.assert_array_equal(blobs[bottom].diff, g.reshape(blobs[bottom].shape))
    for split_top in ("conv_conv_0_split_0", "conv_conv_0_split_1"):
        assert not np.shares_memory(blobs["conv"].diff, blobs[split_top].diff)
    # ip2's Backward writes resh's diff, which is the Reshape's bottom's, with no other layer
    blobs["ip2"].diff[...] = 1
    net.backward(start="ip2", end="ip2")
    w2 = net.params["ip2"][0].data
    expected = np.ones((2, 3), np.float32) @ w2
    np.testing.assert_allclose(
        blobs["conv_conv_0_split_1"].diff.reshape(2, -1), expected, rtol=1e-5
    )


def test_sharing_holds_after_the_input_is_reshaped(tmp_path):
    net = make_net(tmp_path)
    net.forward()
    net.blobs["data"].reshape(5, 3, 4, 4)  # every blob grows: new memories
    net.blobs["data"].data[...] = np.random.default_rng(1).standard_normal((5, 3, 4, 4))
    net.forward()
    assert net.blobs["flat"].data.shape == (5, 16)
    for name in VIEWS:
        assert np.shares_memory(net.blobs["conv"].data, net.blobs[name].data), name
    y = np.ones((5, 4, 2, 2), np.float32)
    net.blobs["conv"].data[...] = y
    net.forward(start="ip", end="ip")
    w, b = (p.data for p in net.params["ip"])
    np.testing.assert_allclose(net.blobs["ip"].data, y.reshape(5, -1) @ w.T + b, rtol=1e-5)
    net.blobs["data"].reshape(1, 3, 4, 4)
    net.reshape()
    assert net.blobs["resh"].data.shape == (1, 16)
    for name in VIEWS:
        assert np.shares_memory(net.blobs["conv"].data, net.blobs[name].data), name


def test_a_reshaped_input_is_the_input(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(
        'input: "data" input_shape { dim: 2 dim: 6 }\n'
        'layer { name: "r" type: "Reshape" bottom: "data" top: "r"'
        " reshape_param { shape { dim: 0 dim: 2 dim: 3 } } }\n"
        'layer { name: "s" type: "Softmax" bottom: "r" top: "s" softmax_param { axis: 2 } }\n'
    )
    net = caffe.Net(str(path), caffe.TEST)
    x = np.arange(12, dtype=np.float32).reshape(2, 6) / 4
    net.blobs["data"].data[...] = x  # before any forward: ReshapeLayer shares at setup
    np.testing.assert_array_equal(net.blobs["r"].data, x.reshape(2, 2, 3))
    out = net.forward()["s"]
    e = np.exp(x.reshape(2, 2, 3) - x.reshape(2, 2, 3).max(axis=2, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=2, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(net.blobs["data"].data, x)
    assert np.shares_memory(net.blobs["data"].data, net.blobs["r"].data)
    net.blobs["r"].data[...] = 0
    np.testing.assert_array_equal(net.blobs["data"].data, np.zeros((2, 6)))


@pytest.mark.parametrize("force_backward", [False, True], ids=["inference", "recorded"])
def test_whole_forward_reads_a_write_through_the_shared_memory(tmp_path, force_backward):
    """The ReLU in place on flat rectifies conv's memory before ip2 reads resh (the same
    memory), so Caffe's ip2 sees the rectified values; a whole forward must too."""
    net = make_net(tmp_path, force_backward)
    assert net._stale_alias_reads
    net.forward(end="conv")
    relu = np.maximum(net.blobs["conv"].data, 0).reshape(2, -1)
    out = net.forward()
    w2, b2 = (p.data for p in net.params["ip2"])
    np.testing.assert_allclose(out["ip2"], relu @ w2.T + b2, rtol=1e-5, atol=1e-6)
    w, b = (p.data for p in net.params["ip"])
    np.testing.assert_allclose(out["ip"], relu @ w.T + b, rtol=1e-5, atol=1e-6)
