"""Blobs written between forward() and backward(): Caffe's Backward reads the live blobs.

Layers whose Caffe Backward_cpu reads bottom data (InnerProduct, Convolution, ReLU, ...) must
use what the script wrote; layers that read top data or a forward-time buffer (Sigmoid,
Pooling MAX) must keep what the forward left. References are computed here from the edited
arrays in float64 with torch/numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchcaffe as caffe

NET = """
name: "edits"
force_backward: true
input: "data" input_shape { dim: 2 dim: 3 dim: 6 dim: 6 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.5 }
                      bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "r1" }
layer { name: "sig" type: "Sigmoid" bottom: "r1" top: "s1" }
layer { name: "pool" type: "Pooling" bottom: "s1" top: "p1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "p1" top: "ip"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu2" type: "ReLU" bottom: "ip" top: "ip" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip" top: "ip2"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
"""


@pytest.fixture
def net(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    net = caffe.Net(str(path), caffe.TRAIN)
    rng = np.random.default_rng(7)
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
    net.forward()
    net.blobs["ip2"].diff[...] = rng.standard_normal(net.blobs["ip2"].shape)
    return net


def f64(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def edit(net, name, seed):
    value = np.random.default_rng(seed).standard_normal(net.blobs[name].shape)
    net.blobs[name].data[...] = value
    return net.blobs[name].data.astype(np.float64)  # what the blob holds (float32)


def close(got, want):
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-5)


def test_relu_reads_the_edited_bottom(net):
    conv1 = edit(net, "conv1", 1)
    net.backward()
    close(net.blobs["conv1"].diff, net.blobs["r1"].diff * (conv1 > 0))


def test_inner_product_reads_the_edited_bottom_and_weights(net):
    p1 = edit(net, "p1", 2)
    w = np.random.default_rng(3).standard_normal(net.params["ip"][0].shape)
    net.params["ip"][0].data[...] = w
    w = net.params["ip"][0].data.astype(np.float64)
    net.clear_param_diffs()
    net.backward()
    dtop = net.blobs["ip"].diff.astype(np.float64)
    flat = p1.reshape(len(p1), -1)
    close(net.params["ip"][0].diff, dtop.T @ flat)
    close(net.blobs["p1"].diff, (dtop @ w).reshape(p1.shape))


def test_in_place_relu_then_inner_product_read_the_edited_blob(net):
    ip = edit(net, "ip", 4)  # the blob relu2 works in place on
    net.clear_param_diffs()
    net.backward()
    dtop = net.blobs["ip2"].diff.astype(np.float64)
    w2 = net.params["ip2"][0].data.astype(np.float64)
    close(net.params["ip2"][0].diff, dtop.T @ ip)
    # relu2's Backward reads the blob it shares with its bottom: the edited values
    p1 = net.blobs["p1"].data.astype(np.float64).reshape(2, -1)
    close(net.params["ip"][0].diff, ((dtop @ w2) * (ip > 0)).T @ p1)


def test_convolution_reads_the_edited_input(net):
    data = edit(net, "data", 5)
    net.clear_param_diffs()
    net.backward()
    x = f64(data).requires_grad_(True)
    w = f64(net.params["conv1"][0].data).requires_grad_(True)
    out = F.conv2d(x, w, f64(net.params["conv1"][1].data))
    gx, gw = torch.autograd.grad(out, (x, w), f64(net.blobs["conv1"].diff))
    close(net.params["conv1"][0].diff, gw)
    close(net.blobs["data"].diff, gx)


def test_sigmoid_keeps_reading_its_top_as_caffe_does(net):
    s1 = net.blobs["s1"].data.astype(np.float64)
    edit(net, "r1", 6)  # Caffe's Sigmoid Backward reads top data, not the bottom
    net.backward()
    close(net.blobs["r1"].diff, net.blobs["s1"].diff * s1 * (1 - s1))


def test_sigmoid_reads_an_edited_top_as_caffe_does(net):
    s1 = edit(net, "s1", 12) * 0.5  # any values: Caffe's Backward just reads them
    net.blobs["s1"].data[...] = s1
    s1 = net.blobs["s1"].data.astype(np.float64)
    net.backward()
    close(net.blobs["r1"].diff, net.blobs["s1"].diff * s1 * (1 - s1))


TANH = """
name: "tanh" force_backward: true
input: "x" input_shape { dim: 2 dim: 3 }
layer { name: "t" type: "TanH" bottom: "x" top: "y" }
layer { name: "t2" type: "TanH" bottom: "y" top: "y" }
"""


def test_tanh_in_place_and_not_read_the_top_blob_now(tmp_path):
    path = tmp_path / "tanh.prototxt"
    path.write_text(TANH)
    net = caffe.Net(str(path), caffe.TRAIN)
    net.blobs["x"].data[...] = [[0.5, -1, 2], [-2, 0.1, 3]]
    net.forward()
    y = np.tanh(np.tanh(net.blobs["x"].data.astype(np.float64)))
    close(net.blobs["y"].data, y)
    net.blobs["y"].diff[...] = 1.0
    net.backward()
    # Caffe: t2 (in place) and t both read blob y, which holds t2's output
    close(net.blobs["x"].diff, (1 - y * y) * (1 - y * y))
    y2 = edit(net, "y", 13)
    net.blobs["y"].diff[...] = 1.0
    net.backward()
    close(net.blobs["x"].diff, (1 - y2 * y2) * (1 - y2 * y2))


def test_max_pooling_routes_by_the_forward_argmax_as_caffe_does(net):
    before = net.blobs["s1"].data.astype(np.float64)
    edit(net, "s1", 8)  # Caffe's MAX pooling Backward uses the mask its forward stored
    net.backward()
    x = f64(before).requires_grad_(True)
    out = F.max_pool2d(x, 2, 2)
    (gx,) = torch.autograd.grad(out, x, f64(net.blobs["p1"].diff))
    close(net.blobs["s1"].diff, gx)


def test_unedited_blobs_keep_the_forward_record(net, monkeypatch):
    replayed = []
    replay = net._replay
    monkeypatch.setattr(net, "_replay", lambda i, d: replayed.append(i) or replay(i, d))
    net.backward()
    first = {n: net.blobs[n].diff.copy() for n in net.blobs}
    _ = net.blobs["conv1"].data  # reading is not writing
    net.backward()
    assert replayed == []
    for name, diff in first.items():
        np.testing.assert_array_equal(net.blobs[name].diff, diff)
    edit(net, "p1", 10)
    net.backward()
    assert replayed == [net._layer_names.index("ip")]


def test_edits_after_a_partial_forward_are_seen(net):
    net.forward(start="ip")
    p1 = edit(net, "p1", 9)
    net.clear_param_diffs()
    net.backward(start="ip2", end="ip")
    dip = net.blobs["ip"].diff.astype(np.float64)  # after relu2, which shares the blob
    close(net.params["ip"][0].diff, dip.T @ p1.reshape(2, -1))


INDEXED = """
name: "indexed"
input: "x" input_shape { dim: 3 dim: 2 }
input: "perm" input_shape { dim: 3 }
input: "word" input_shape { dim: 3 }
input: "t" input_shape { dim: 3 dim: 2 }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "h"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
layer { name: "reindex" type: "BatchReindex" bottom: "h" bottom: "perm" top: "r" }
layer { name: "embed" type: "Embed" bottom: "word" top: "e"
  embed_param { num_output: 2 input_dim: 4 weight_filler { type: "gaussian" } } }
layer { name: "sum" type: "Eltwise" bottom: "r" bottom: "e" top: "y" }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }
"""


def test_embed_and_batch_reindex_route_the_diff_by_the_edited_indices(tmp_path):
    # Caffe: EmbedLayer::Backward_cpu and BatchReindexLayer::Backward_cpu read the index
    # bottom's data when they run, so indices written after forward() pick the rows
    path = tmp_path / "indexed.prototxt"
    path.write_text(INDEXED)
    net = caffe.Net(str(path), caffe.TRAIN)
    net.blobs["x"].data[...] = np.random.default_rng(8).standard_normal((3, 2))
    net.blobs["perm"].data[...] = [0, 1, 2]
    net.blobs["word"].data[...] = [0, 1, 2]
    net.forward()
    net.blobs["perm"].data[...] = [2, 2, 0]
    net.blobs["word"].data[...] = [3, 3, 1]
    net.clear_param_diffs()
    net.backward()
    dy = net.blobs["y"].diff.astype(np.float64)
    close(net.blobs["h"].diff, [dy[2], np.zeros(2), dy[0] + dy[1]])
    close(net.params["embed"][0].diff, [np.zeros(2), dy[2], np.zeros(2), dy[0] + dy[1]])


FAN_OUT = """
name: "fan" force_backward: true
input: "x" input_shape { dim: 2 dim: 3 }
layer { name: "a" type: "ReLU" bottom: "x" top: "a" }
layer { name: "b" type: "ReLU" bottom: "x" top: "b" }
"""


def test_consumers_recorded_by_different_forwards_each_see_the_edit(tmp_path):
    path = tmp_path / "fan.prototxt"
    path.write_text(FAN_OUT)
    net = caffe.Net(str(path), caffe.TRAIN)
    net.blobs["x"].data[...] = [[1, -1, 2], [-2, 3, -3]]
    net.forward()
    x = -net.blobs["x"].data.copy()
    net.blobs["x"].data[...] = x
    net.forward(start="b")  # b is recorded with the edited x, a still with the first one
    net.blobs["a"].diff[...] = 1
    net.blobs["b"].diff[...] = 1
    # x feeds a and b through a Split, whose tops share x's data in Caffe
    (into_a,), (into_b,) = net.bottom_names["a"], net.bottom_names["b"]
    net.backward(start="b", end="b")
    close(net.blobs[into_b].diff, (x > 0) * 1.0)
    net.backward(start="a", end="a")  # Caffe's ReLU reads x as it is now
    close(net.blobs[into_a].diff, (x > 0) * 1.0)
    net.backward()
    close(net.blobs["x"].diff, (x > 0) * 2.0)


def test_forward_backward_neither_snapshots_nor_compares(net, monkeypatch):
    # the solver's training step: nothing can edit between its forward and backward
    calls = []
    monkeypatch.setattr(net, "_note_forward_data", lambda *a: calls.append("note"))
    monkeypatch.setattr(net, "_bottoms_edited", lambda *a: calls.append("check") or True)
    net.forward_backward()
    assert calls == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU mode needs CUDA")
def test_gpu_reads_and_edits_between_forward_and_backward(tmp_path):
    # On a device, a host-side edit must not be synced into the buffers the forward's graph
    # saved (that bumps their autograd version, and backward would refuse): same diffs as CPU.
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    results = []
    for mode in (caffe.set_mode_cpu, caffe.set_mode_gpu):
        mode()
        try:
            net = caffe.Net(str(path), caffe.TRAIN)
            rng = np.random.default_rng(7)
            net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
            for name in net.params:  # the same weights in both runs
                for j, p in enumerate(net.params[name]):
                    p.data[...] = np.random.default_rng(j).standard_normal(p.shape)
            net.forward()
            net.blobs["ip2"].diff[...] = 1.0
            _ = net.blobs["s1"].data  # a read: the host side becomes the newest
            edit(net, "conv1", 11)  # feeds ReLU (recomputed) and nothing else
            net.backward()
            results.append({n: net.blobs[n].diff.copy() for n in net.blobs})
        finally:
            caffe.set_mode_cpu()
    for name in results[0]:
        close(results[1][name], results[0][name])


IN_PLACE_SLOPES = """
force_backward: true
input: "x" input_shape { dim: 2 dim: 4 }
layer { name: "bnll" type: "BNLL" bottom: "x" top: "b" }
layer { name: "bnll2" type: "BNLL" bottom: "b" top: "b" }
layer { name: "log" type: "Log" bottom: "b" top: "b" log_param { scale: 2 shift: 3 } }
layer { name: "clip" type: "Clip" bottom: "b" top: "b" clip_param { min: 1.4 max: 1.6 } }
layer { name: "relu" type: "ReLU" bottom: "b" top: "b" relu_param { negative_slope: 0.5 } }
"""


def test_in_place_layers_read_their_overwritten_bottom_as_caffe_does(tmp_path):
    # Caffe's in-place BNLL, Log and Clip Backward read blob b after the chain overwrote it:
    # each local slope is taken at b's final data, not at what the layer's forward read.
    path = tmp_path / "slopes.prototxt"
    path.write_text(IN_PLACE_SLOPES)
    net = caffe.Net(str(path), caffe.TRAIN)
    net.blobs["x"].data[...] = [[-2, -0.5, 0, 0.3], [0.7, 1.2, 2.5, -4]]
    net.forward()
    b = net.blobs["b"].data.astype(np.float64)
    net.blobs["b"].diff[...] = 1.0
    net.backward()
    # relu and clip scale b's diff, but Log's in-place Backward overwrites that diff with its
    # slope and multiplies the slope by itself (checked against BVLC Caffe built from source)
    g = (2 / (2 * b + 3)) ** 2  # log
    g = g * np.exp(b) / (np.exp(b) + 1)  # bnll2
    close(net.blobs["b"].diff, g)
    x = net.blobs["x"].data.astype(np.float64)
    close(net.blobs["x"].diff, g * np.exp(x) / (np.exp(x) + 1))  # bnll reads x


TOP_THEN_DROPOUT = """
force_backward: true
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 4 dim: 6 } } }
layer { name: "act" type: "%s" bottom: "x" top: "h" }
layer { name: "drop" type: "Dropout" bottom: "h" top: "h" dropout_param { dropout_ratio: 0.5 } }
layer { name: "loss" type: "Reduction" bottom: "h" top: "loss" loss_weight: 1 }
"""


@pytest.mark.parametrize("kind", ["Sigmoid", "TanH"])
def test_forward_backward_reads_a_top_a_later_in_place_layer_overwrote(tmp_path, kind):
    # Caffe's Net::ForwardBackward is Forward then Backward: Sigmoid's and TanH's Backward read
    # blob h after the in-place Dropout scaled and zeroed it, as in a separate backward().
    path = tmp_path / "top.prototxt"
    path.write_text(TOP_THEN_DROPOUT % kind)
    net = caffe.Net(str(path), caffe.TRAIN)
    net.blobs["x"].data[...] = np.random.default_rng(3).standard_normal((4, 6))
    net.forward_backward()
    h = net.blobs["h"].data.astype(np.float64)
    slope = h * (1 - h) if kind == "Sigmoid" else 1 - h * h
    close(net.blobs["x"].diff, (h != 0) * 2.0 * slope)


ELU_THEN_DROPOUT = """
force_backward: true
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 4 dim: 6 } } }
layer { name: "p" type: "Power" bottom: "x" top: "h" }
layer { name: "elu" type: "ELU" bottom: "h" top: "h" elu_param { alpha: 0.7 } }
layer { name: "drop" type: "Dropout" bottom: "h" top: "h" dropout_param { dropout_ratio: 0.5 } }
layer { name: "loss" type: "Reduction" bottom: "h" top: "loss" loss_weight: 1 }
"""


@pytest.mark.parametrize("one_call", [True, False], ids=["forward_backward", "backward"])
def test_in_place_elu_reads_the_blob_a_later_dropout_overwrote(tmp_path, one_call):
    # ELULayer::Backward_cpu: top_diff * ((bottom > 0) + (alpha + top) * (bottom <= 0)); in
    # place both are blob h, which holds the Dropout's output by then
    path = tmp_path / "elu.prototxt"
    path.write_text(ELU_THEN_DROPOUT)
    net = caffe.Net(str(path), caffe.TRAIN)
    net.blobs["x"].data[...] = np.random.default_rng(4).standard_normal((4, 6))
    if one_call:
        net.forward_backward()
    else:
        net.forward()
        net.blobs["h"].diff[...] = 1.0
        net.backward()
    h = net.blobs["h"].data.astype(np.float64)
    slope = (h > 0) + (0.7 + h) * (h <= 0)
    close(net.blobs["x"].diff, (h != 0) * 2.0 * slope)


MVN_THEN_SCALE = """
force_backward: true
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 4 } } }
layer { name: "mvn" type: "MVN" bottom: "x" top: "n" %s }
layer { name: "sc" type: "Scale" bottom: "n" top: "n" scale_param { bias_term: true
  filler { type: "constant" value: 1.5 } bias_filler { type: "constant" value: 0.3 } } }
layer { name: "loss" type: "Reduction" bottom: "n" top: "loss" loss_weight: 0.5
  reduction_param { operation: SUMSQ } }
"""


@pytest.mark.parametrize("one_call", [True, False], ids=["forward_backward", "backward"])
@pytest.mark.parametrize("across", [False, True], ids=["per_channel", "across_channels"])
def test_mvn_reads_the_top_a_later_in_place_scale_overwrote(tmp_path, one_call, across):
    # MVNLayer::Backward_cpu reads top data: after the in-place Scale, blob n holds
    # 1.5 * y + 0.3, and Caffe's diff is (dy - (z sum(z dy) + sum(dy)) / dim) / (std + eps)
    # with that z; std + eps is its forward's variance_ buffer.
    path = tmp_path / "mvn.prototxt"
    path.write_text(MVN_THEN_SCALE % f"mvn_param {{ across_channels: {str(across).lower()} }}")
    net = caffe.Net(str(path), caffe.TRAIN)
    x = np.random.default_rng(6).standard_normal((2, 3, 4))
    net.blobs["x"].data[...] = x
    if one_call:
        net.forward_backward()
    else:
        net.forward()
        net.backward()
    rows = 2 if across else 6
    z = net.blobs["n"].data.astype(np.float64).reshape(rows, -1)
    dy = 1.5 * z  # the loss's diff z, through the Scale
    xs = net.blobs["x"].data.astype(np.float64).reshape(rows, -1)
    centered = xs - xs.mean(axis=1, keepdims=True)
    denom = np.sqrt((centered**2).mean(axis=1, keepdims=True)) + 1e-9
    sums = z * (z * dy).sum(axis=1, keepdims=True) + dy.sum(axis=1, keepdims=True)
    want = (dy - sums / z.shape[1]) / denom
    close(net.blobs["x"].diff, want.reshape(2, 3, 4))


MVN_IN_PLACE_THEN_SCALE = MVN_THEN_SCALE.replace(
    'layer { name: "mvn" type: "MVN" bottom: "x" top: "n" %s }',
    'layer { name: "p" type: "Power" bottom: "x" top: "n" }\n'
    'layer { name: "mvn" type: "MVN" bottom: "n" top: "n" }',
)


@pytest.mark.parametrize("one_call", [True, False], ids=["forward_backward", "backward"])
def test_in_place_mvn_reads_the_scaled_blob_and_its_own_partial_diff(tmp_path, one_call):
    # In place, MVNLayer::Backward_cpu reads blob n (the Scale's output by then) and writes
    # the diff it reads: d = z sum(z dy); d += sum(d); then axpby(1, d, -1/dim, d) on that one
    # buffer (BVLC's non-MKL saxpby: scal, then axpy of the scaled buffer onto itself) gives
    # -2 d / dim; / (std + eps). Checked against BVLC Caffe 1.0 built from source (CPU).
    path = tmp_path / "mvn.prototxt"
    path.write_text(MVN_IN_PLACE_THEN_SCALE)
    net = caffe.Net(str(path), caffe.TRAIN)
    net.blobs["x"].data[...] = np.random.default_rng(9).standard_normal((2, 3, 4))
    if one_call:
        net.forward_backward()
    else:
        net.forward()
        net.backward()
    z = net.blobs["n"].data.astype(np.float64).reshape(6, -1)
    dy = 1.5 * z
    xs = net.blobs["x"].data.astype(np.float64).reshape(6, -1)
    centered = xs - xs.mean(axis=1, keepdims=True)
    denom = np.sqrt((centered**2).mean(axis=1, keepdims=True)) + 1e-9
    d = z * (z * dy).sum(axis=1, keepdims=True)
    d = d + d.sum(axis=1, keepdims=True)
    close(net.blobs["x"].diff, ((-2 * d / 4) / denom).reshape(2, 3, 4))


ACT_THEN_DROPOUT = """
force_backward: true
layer { name: "x" type: "Input" top: "x" input_param { shape { %s } } }
layer { name: "act" %s bottom: "x" top: "h" }
layer { name: "drop" type: "Dropout" bottom: "h" top: "h" dropout_param { dropout_ratio: 0.5 } }
layer { name: "loss" type: "Reduction" bottom: "h" top: "loss" loss_weight: 1 }
"""


def _act_then_dropout(tmp_path, layer, seed, one_call, shape=(4, 6)):
    """Run ``layer`` (x -> h) then an in-place Dropout on h, forward and backward in one call
    or two; returns the net and x, h as float64 (h as the Dropout left it)."""
    path = tmp_path / "act.prototxt"
    path.write_text(ACT_THEN_DROPOUT % (" ".join(f"dim: {d}" for d in shape), layer))
    net = caffe.Net(str(path), caffe.TRAIN)
    net.blobs["x"].data[...] = np.random.default_rng(seed).standard_normal(shape)
    if one_call:
        net.forward_backward()
    else:
        net.forward()
        net.backward()
    return net, net.blobs["x"].data.astype(np.float64), net.blobs["h"].data.astype(np.float64)


@pytest.mark.parametrize("one_call", [True, False], ids=["forward_backward", "backward"])
@pytest.mark.parametrize("kind", ["exp", "swish"])
def test_exp_and_swish_read_the_top_a_later_dropout_overwrote(tmp_path, one_call, kind):
    # ExpLayer::Backward_cpu: top_diff * top * inner_scale; SwishLayer::Backward_cpu:
    # top_diff * (beta * top + s * (1 - beta * top)), s its forward's sigmoid(beta * x)
    layer = {
        "exp": 'type: "Exp" exp_param { base: 2 scale: 0.5 }',
        "swish": 'type: "Swish" swish_param { beta: 1.5 }',
    }[kind]
    net, x, h = _act_then_dropout(tmp_path, layer, 5, one_call)
    if kind == "exp":
        slope = h * np.log(2) * 0.5
    else:
        s = 1 / (1 + np.exp(-1.5 * x))
        slope = 1.5 * h + s * (1 - 1.5 * h)
    close(net.blobs["x"].diff, (h != 0) * 2.0 * slope)


@pytest.mark.parametrize("one_call", [True, False], ids=["forward_backward", "backward"])
def test_elu_reads_its_bottom_and_the_top_a_later_dropout_overwrote(tmp_path, one_call):
    # ELULayer::Backward_cpu reads bottom x and top e live: (x > 0) + (alpha + e) * (x <= 0),
    # e as the in-place Dropout left it
    elu = 'type: "ELU" elu_param { alpha: 0.7 }'
    net, x, h = _act_then_dropout(tmp_path, elu, 2, one_call)
    slope = (x > 0) + (0.7 + h) * (x <= 0)
    close(net.blobs["x"].diff, (h != 0) * 2.0 * slope)


@pytest.mark.parametrize("one_call", [True, False], ids=["forward_backward", "backward"])
def test_power_reads_its_bottom_and_the_top_a_later_dropout_overwrote(tmp_path, one_call):
    # PowerLayer::Backward_cpu (shift != 0): power * scale * top / (shift + scale * bottom),
    # both blobs live: top as the in-place Dropout left it
    power = 'type: "Power" power_param { power: 3 scale: 0.5 shift: 2 }'
    net, x, h = _act_then_dropout(tmp_path, power, 12, one_call)
    close(net.blobs["x"].diff, (h != 0) * 2.0 * 1.5 * h / (0.5 * x + 2))


@pytest.mark.parametrize("one_call", [True, False], ids=["forward_backward", "backward"])
def test_softmax_reads_the_top_a_later_dropout_overwrote(tmp_path, one_call):
    # SoftmaxLayer::Backward_cpu: (top_diff - sum_c(top_diff * top)) * top, top live
    net, _, h = _act_then_dropout(tmp_path, 'type: "Softmax"', 14, one_call)
    g = (h != 0) * 2.0  # the loss's diff 1 through the Dropout
    close(net.blobs["x"].diff, (g - (g * h).sum(axis=1, keepdims=True)) * h)


MVN_ALONE = """
force_backward: true
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 4 } } }
layer { name: "mvn" type: "MVN" bottom: "x" top: "n" mvn_param { across_channels: %s } }
"""


@pytest.mark.parametrize("across", [False, True], ids=["per_channel", "across_channels"])
def test_mvn_keeps_its_forward_variance_after_a_bottom_edit(tmp_path, across):
    # MVNLayer::Backward_cpu reads top data and its forward's variance_: an edit of blob x
    # after forward() changes neither
    path = tmp_path / "mvn.prototxt"
    path.write_text(MVN_ALONE % str(across).lower())
    net = caffe.Net(str(path), caffe.TRAIN)
    rng = np.random.default_rng(8)
    net.blobs["x"].data[...] = rng.standard_normal((2, 3, 4))
    rows = 2 if across else 6
    xs = net.blobs["x"].data.astype(np.float64).reshape(rows, -1)
    net.forward()
    edit(net, "x", 9)
    dy = rng.standard_normal(net.blobs["n"].shape)
    net.blobs["n"].diff[...] = dy
    net.backward()
    z = net.blobs["n"].data.astype(np.float64).reshape(rows, -1)
    dy = net.blobs["n"].diff.astype(np.float64).reshape(rows, -1)
    centered = xs - xs.mean(axis=1, keepdims=True)
    denom = np.sqrt((centered**2).mean(axis=1, keepdims=True)) + 1e-9
    sums = z * (z * dy).sum(axis=1, keepdims=True) + dy.sum(axis=1, keepdims=True)
    close(net.blobs["x"].diff, ((dy - sums / z.shape[1]) / denom).reshape(2, 3, 4))


LRN = 'type: "LRN" lrn_param { local_size: 5 alpha: 0.1 beta: 0.75 norm_region: %s }'
LRN_SHAPE = (2, 7, 3, 4)


def _lrn_backward(x, x_now, y_now, dy, across, n=5, alpha=0.1, beta=0.75):
    """LRNLayer::Backward_cpu in float64, what its forward kept from ``x``, bottom and top as
    they are now: ACROSS_CHANNELS reads both and scale_; WITHIN_CHANNEL's sublayers read the
    bottom (the Eltwise product, the squaring Power) and the inner Power's forward blobs."""
    if across:
        pad = np.pad(x * x, ((0, 0), (2, 2), (0, 0), (0, 0)))
        scale = 1 + alpha / n * sum(pad[:, i : i + x.shape[1]] for i in range(n))
        ratio = np.pad(dy * y_now / scale, ((0, 0), (2, 2), (0, 0), (0, 0)))
        window = sum(ratio[:, i : i + x.shape[1]] for i in range(n))
        return scale**-beta * dy - 2 * alpha * beta / n * x_now * window
    sq = f64(x * x).requires_grad_(True)
    pool = F.avg_pool2d(sq, n, 1, 2, ceil_mode=True, count_include_pad=True)
    p = (1 + alpha * pool.detach()) ** -beta
    slope = -beta * alpha * p / (1 + alpha * pool.detach())
    (d_sq,) = torch.autograd.grad(pool, sq, f64(x_now * dy) * slope)
    return p.numpy() * dy + 2 * x_now * d_sq.numpy()


@pytest.mark.parametrize("across", [False, True], ids=["within_channel", "across_channels"])
def test_lrn_reads_the_edited_bottom_and_top_as_caffe_does(tmp_path, across):
    # ACROSS_CHANNELS: CrossChannelBackward_cpu reads bottom and top data live, scale_ from
    # its forward; WITHIN_CHANNEL: the bottom live (its Split's tops share its data)
    path = tmp_path / "lrn.prototxt"
    region = "ACROSS_CHANNELS" if across else "WITHIN_CHANNEL"
    path.write_text(
        'force_backward: true\nlayer { name: "x" type: "Input" top: "x" input_param { shape { '
        + " ".join(f"dim: {d}" for d in LRN_SHAPE)
        + ' } } }\nlayer { name: "lrn" %s bottom: "x" top: "y" }\n' % (LRN % region)
    )
    net = caffe.Net(str(path), caffe.TRAIN)
    rng = np.random.default_rng(10)
    net.blobs["x"].data[...] = 2 * rng.standard_normal(LRN_SHAPE)
    x = net.blobs["x"].data.astype(np.float64)
    net.forward()
    x_now = edit(net, "x", 11)
    y_now = edit(net, "y", 12)
    dy = rng.standard_normal(LRN_SHAPE)
    net.blobs["y"].diff[...] = dy
    net.backward()
    dy = net.blobs["y"].diff.astype(np.float64)
    close(net.blobs["x"].diff, _lrn_backward(x, x_now, y_now, dy, across))


@pytest.mark.parametrize("one_call", [True, False], ids=["forward_backward", "backward"])
@pytest.mark.parametrize("across", [False, True], ids=["within_channel", "across_channels"])
def test_lrn_reads_the_top_a_later_dropout_overwrote(tmp_path, one_call, across):
    # ACROSS_CHANNELS reads top h as the in-place Dropout left it; WITHIN_CHANNEL no top
    layer = LRN % ("ACROSS_CHANNELS" if across else "WITHIN_CHANNEL")
    net, x, h = _act_then_dropout(tmp_path, layer, 13, one_call, LRN_SHAPE)
    close(net.blobs["x"].diff, _lrn_backward(x, x, h, (h != 0) * 2.0, across))


def test_backward_after_a_forward_over_an_earlier_range(tmp_path):
    """forward(start=conv1, end=relu2) writes conv1's memory again (in place): conv4's record
    from the whole forward saved that memory as its bottom, so its backward must read the
    blob anew (as Caffe's does) rather than hand autograd the rewritten tensor."""
    path = tmp_path / "net.prototxt"
    path.write_text(
        'force_backward: true input: "data" input_shape { dim: 2 dim: 4 dim: 2 dim: 2 }\n'
        'layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"\n'
        '  convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "xavier" } } }\n'
        'layer { name: "relu2" type: "ReLU" bottom: "conv1" top: "conv1" }\n'
        'layer { name: "ip3" type: "InnerProduct" bottom: "conv1" top: "ip3"\n'
        '  inner_product_param { num_output: 4 weight_filler { type: "gaussian" } } }\n'
        'layer { name: "conv4" type: "Convolution" bottom: "conv1" top: "conv4"\n'
        '  convolution_param { num_output: 2 kernel_size: 1 weight_filler { type: "xavier" } } }\n'
    )
    net = caffe.Net(str(path), caffe.TEST)
    net.blobs["data"].data[...] = np.random.default_rng(0).standard_normal((2, 4, 2, 2))
    net.forward()
    net.forward(start="conv1", end="relu2")
    net.blobs["conv4"].diff[...] = 1
    net.backward(start="conv4", end="conv4")
    x = net.blobs["conv1"].data.astype(np.float64)  # the split top conv4 reads shares it
    w = net.params["conv4"][0].data[:, :, 0, 0].astype(np.float64)
    close(net.params["conv4"][0].diff[:, :, 0, 0], np.ones((2, 1)) * x.sum(axis=(0, 2, 3)))
    close(
        net.blobs["conv1_relu2_0_split_1"].diff,
        np.einsum("oc,nohw->nchw", w, np.ones((2, 2, 2, 2))),
    )


RELU_THEN_SCALE = """
force_backward: true
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 dim: 1 dim: 1 } } }
layer { name: "relu" type: "ReLU" bottom: "x" top: "x" }
layer { name: "scale" type: "Scale" bottom: "x" top: "x" scale_param { bias_term: true } }
layer { name: "loss" type: "EuclideanLoss" bottom: "x" bottom: "t" top: "loss" }
layer { name: "t" type: "Input" top: "t" input_param { shape { dim: 1 dim: 2 } } }
"""


@pytest.mark.parametrize("one_call", [True, False], ids=["forward_backward", "backward"])
def test_in_place_relu_masks_with_what_a_later_in_place_scale_left(tmp_path, one_call):
    # ReLULayer::Backward_cpu: top_diff * (bottom_data > 0); in place, bottom_data is the
    # blob after the Scale in place on it: sign(-relu(x) + 0.5), not relu(x)'s
    path = tmp_path / "relu_scale.prototxt"
    lines = RELU_THEN_SCALE.strip().splitlines()
    path.write_text("\n".join(lines[:2] + [lines[5]] + lines[2:5]))  # inputs first
    net = caffe.Net(str(path), caffe.TRAIN)
    net.params["scale"][0].data[...] = -1
    net.params["scale"][1].data[...] = 0.5
    net.blobs["x"].data[...] = np.array([1.0, -1.0]).reshape(1, 2, 1, 1)
    if one_call:
        net.forward_backward()
    else:
        net.forward()
        net.backward()
    out = np.array([-0.5, 0.5])  # -relu(x) + 0.5
    scale_diff = -out  # EuclideanLoss: (out - 0) / num, then the Scale's -1
    np.testing.assert_allclose(net.blobs["x"].diff.ravel(), scale_diff * (out > 0), atol=1e-7)


def test_a_dropout_after_an_in_place_relu_keeps_the_one_pass(tmp_path):
    """A Dropout in place after the ReLU (CaffeNet's fc6 -> relu6 -> drop6) zeroes the diff
    wherever it zeroes the data, so Caffe's mask gives the ReLU's own gradient: the solvers'
    one autograd pass stays; a Scale in place after it does not."""
    from torchcaffe.pycaffe.one_pass import plan_one_pass

    path = tmp_path / "relu_drop.prototxt"
    lines = RELU_THEN_SCALE.strip().splitlines()
    dropout = 'layer { name: "drop" type: "Dropout" bottom: "x" top: "x" }'
    path.write_text("\n".join(lines[:2] + [lines[5], lines[2], dropout, lines[4]]))
    net = caffe.Net(str(path), caffe.TRAIN)
    assert not net._relu_masks_moved and plan_one_pass(net) is not None
    path.write_text("\n".join(lines[:2] + [lines[5]] + lines[2:5]))
    net = caffe.Net(str(path), caffe.TRAIN)
    assert net._relu_masks_moved == {2} and plan_one_pass(net) is None  # after x, t
