"""caffe.Net as pycaffe's test_net.py exercises it, through ``import torchcaffe as caffe``."""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe.errors import BlobWiringError

NET = """
name: "testnet" force_backward: true
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 5 dim: 2 dim: 3 dim: 4 }
                      shape { dim: 5 dim: 1 dim: 1 dim: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 11 kernel_size: 2 pad: 3
          weight_filler { type: "gaussian" std: 1 } bias_filler { type: "constant" value: 2 } }
        param { decay_mult: 1 } param { decay_mult: 0 } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip_blob"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 2.5 }
          bias_filler { type: "constant" value: -3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip_blob" bottom: "label" top: "loss" }
"""


@pytest.fixture
def net(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    n = caffe.Net(str(path), caffe.TRAIN)
    n.blobs["data"].data[...] = np.random.default_rng(0).standard_normal((5, 2, 3, 4))
    n.blobs["label"].data[...] = np.array([0, 1, 2, 1, 0]).reshape(5, 1, 1, 1)
    return n


def test_memory_and_forward_backward(net):
    params = sum(map(list, net.params.values()), [])
    blobs = net.blobs.values()
    net.forward()
    net.backward()
    for p in params:
        assert p.data.sum() + p.diff.sum() == p.data.sum() + p.diff.sum()
    for b in blobs:
        assert np.isfinite(b.data).all()


def test_layer_dict_and_names(net):
    assert list(net.layer_dict) == list(net._layer_names)
    for i, name in enumerate(net._layer_names):
        assert net.layer_dict[name].type == net.layers[i].type
    assert net.top_names["ip"] == ["ip_blob"] and net.bottom_names["loss"] == ["ip_blob", "label"]
    assert net.inputs == ["data", "label"] and net.outputs == ["loss"]


def test_blob_loss_weights_is_a_list_in_blob_order(net):
    weights = net._blob_loss_weights
    assert isinstance(weights, list) and len(weights) == len(net.blobs)
    assert weights[list(net.blobs).index("loss")] == 1.0
    assert net.blob_loss_weights == dict(zip(net.blobs, weights))


def test_forward_start_end(net):
    conv_blob = net.blobs["conv"]
    ip_blob = net.blobs["ip_blob"]
    sample = np.random.default_rng(1).random(conv_blob.data.shape).astype(np.float32)
    conv_blob.data[...] = sample
    net.forward(start="ip", end="ip")
    w, b = net.params["ip"][0].data, net.params["ip"][1].data
    want = sample.reshape(5, -1) @ w.T + b
    np.testing.assert_allclose(ip_blob.data, want, rtol=1e-4, atol=1e-4)


def test_backward_start_end_without_forward(net):
    """Caffe's backward reads the blobs as they are: no forward is needed before it."""
    conv_blob, ip_blob = net.blobs["conv"], net.blobs["ip_blob"]
    sample = np.random.default_rng(2).random(ip_blob.diff.shape).astype(np.float32)
    ip_blob.diff[...] = sample
    net.backward(start="ip", end="ip")
    w = net.params["ip"][0].data
    np.testing.assert_allclose(conv_blob.diff.reshape(5, -1), sample @ w, rtol=1e-4, atol=1e-4)


def test_backward_without_forward_uses_current_bottom_data(net):
    """The param diff of InnerProduct needs the bottom data: it comes from the blob now."""
    net.clear_param_diffs()
    conv = np.random.default_rng(3).random(net.blobs["conv"].data.shape).astype(np.float32)
    net.blobs["conv"].data[...] = conv
    top_diff = np.ones(net.blobs["ip_blob"].diff.shape, np.float32)
    net.blobs["ip_blob"].diff[...] = top_diff
    net.backward(start="ip", end="ip")
    np.testing.assert_allclose(
        net.params["ip"][0].diff, top_diff.T @ conv.reshape(5, -1), rtol=1e-4, atol=1e-4
    )
    assert np.abs(net.params["ip"][1].diff).sum() > 0


def test_clear_param_diffs(net):
    net.forward()
    net.backward()
    assert np.abs(net.params["conv"][0].diff).sum() > 0
    net.clear_param_diffs()
    assert all((p.diff == 0).all() for ps in net.params.values() for p in ps)


def test_save_and_copy_from(net, tmp_path):
    weights = str(tmp_path / "w.caffemodel")
    net.save(weights)
    other = caffe.Net(str(tmp_path / "net.prototxt"), weights, caffe.TRAIN)
    for name in net.params:
        for a, b in zip(net.params[name], other.params[name]):
            np.testing.assert_array_equal(a.data, b.data)


def test_stored_diffs_load_into_the_param_diffs(net, tmp_path):
    """Caffe's Blob::FromProto copies a stored diff (snapshot_diff) into the blob's diff, and
    a backward then accumulates onto it; a file without diffs leaves the diffs alone."""
    net.forward()
    net.backward()
    weights = str(tmp_path / "w.caffemodel")
    net.save(weights, write_diff=True)
    other = caffe.Net(str(tmp_path / "net.prototxt"), weights, caffe.TRAIN)
    for name in net.params:
        for a, b in zip(net.params[name], other.params[name]):
            assert np.abs(a.diff).max() > 0
            np.testing.assert_array_equal(a.diff, b.diff)
    other.blobs["data"].data[...] = net.blobs["data"].data
    other.blobs["label"].data[...] = net.blobs["label"].data
    other.forward()
    other.backward()
    np.testing.assert_allclose(other.params["ip"][0].diff, 2 * net.params["ip"][0].diff, 1e-5)
    net.save(weights)
    other.copy_from(weights)
    np.testing.assert_allclose(other.params["ip"][0].diff, 2 * net.params["ip"][0].diff, 1e-5)


def test_save_writes_a_binary_caffemodel_whatever_the_name(net, tmp_path):
    """pycaffe's Net_Save is ToProto + WriteProtoToBinaryFile: a '.h5' name does not make
    it HDF5 (only save_hdf5 writes that)."""
    from torchcaffe.formats.caffemodel import is_hdf5

    weights = str(tmp_path / "w.h5")
    net.save(weights)
    assert not is_hdf5(weights)
    other = caffe.Net(str(tmp_path / "net.prototxt"), weights, caffe.TRAIN)
    np.testing.assert_array_equal(net.params["ip"][0].data, other.params["ip"][0].data)


def test_layer_reshape_shapes_tops_from_bottoms(net):
    net.blobs["data"].reshape(2, 2, 5, 6)
    layer = net.layer_dict["conv"]
    layer.reshape([net.blobs["data"]], [net.blobs["conv"]])
    assert net.blobs["conv"].data.shape == (2, 11, 10, 11)  # (5 + 6 - 2) + 1, (6 + 6 - 2) + 1


STAGED = """
name: "staged"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" } } }
layer { name: "deep" type: "ReLU" bottom: "ip" top: "deep" include { min_level: 1 } }
layer { name: "staged" type: "Sigmoid" bottom: "ip" top: "staged" include { stage: "s" } }
"""


def test_net_takes_level_stages_and_weights_positionally(tmp_path):
    """pycaffe's Net(network_file, phase, level=0, stages=None, weights=None) is a boost
    constructor: the three after phase may be positional too."""
    path = tmp_path / "staged.prototxt"
    path.write_text(STAGED)
    weights = str(tmp_path / "w.caffemodel")
    caffe.Net(str(path), caffe.TEST).save(weights)
    saved = caffe.Net(str(path), weights, caffe.TEST).params["ip"][0].data
    net = caffe.Net(str(path), caffe.TEST, 1, ["s"], weights)
    assert {"deep", "staged"} <= set(net._layer_names)
    np.testing.assert_array_equal(net.params["ip"][0].data, saved)
    assert caffe.Net(str(path), caffe.TEST, 1)._layer_names == ["data", "ip", "deep"]
    net = caffe.Net(str(path), caffe.TEST, 0, ["s"], weights=weights)
    assert net._layer_names == ["data", "ip", "staged"]
    np.testing.assert_array_equal(net.params["ip"][0].data, saved)
    with pytest.raises(TypeError):
        caffe.Net(str(path), caffe.TEST, 1, level=1)


# Caffe: NetTest.TestBottomNeedBackwardTricky builds a net whose SoftmaxWithLoss labels come
# from an InnerProduct, "even though we expect this to cause a crash at training/test time":
# forward runs, Backward aborts at the loss ("cannot backpropagate to label inputs").
TRICKY = """
name: "tricky"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 5 dim: 2 dim: 3 dim: 4 } shape { dim: 5 dim: 1 } } }
layer { name: "ip_data" type: "InnerProduct" bottom: "data" top: "transformed_data"
        inner_product_param { num_output: 10 } }
layer { name: "ip_label" type: "InnerProduct" bottom: "label" top: "transformed_label"
        inner_product_param { num_output: 1 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "transformed_data"
        bottom: "transformed_label" PD top: "loss" }
"""


def _tricky(tmp_path, propagate_down=""):
    path = tmp_path / "tricky.prototxt"
    path.write_text(TRICKY.replace("PD", propagate_down))
    return str(path)


def test_backward_into_loss_labels_is_refused_as_caffe_aborts(tmp_path):
    net = caffe.Net(_tricky(tmp_path), caffe.TRAIN)
    net.forward()
    for run in (net.backward, net.forward_backward):
        with pytest.raises(BlobWiringError, match=r"layer 'loss' \(SoftmaxWithLoss\).*bottom 1"):
            run()
    net.backward(start="ip_label")  # a partial pass that stops short of the loss runs
    # propagate_down: false on the labels is the way out, as in Caffe
    ok = caffe.Net(_tricky(tmp_path, "propagate_down: true propagate_down: false"), caffe.TRAIN)
    ok.forward_backward()


def test_solver_step_through_refused_labels_is_refused(tmp_path):
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{_tricky(tmp_path)}" base_lr: 0.1 lr_policy: "fixed"')
    with pytest.raises(BlobWiringError, match="SoftmaxWithLoss"):
        caffe.SGDSolver(str(solver)).step(1)


ARGMAX_UNDER_LOSS = """
name: "skip_prop" FORCE
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 5 dim: 2 } shape { dim: 5 dim: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 } }
layer { name: "argmax" type: "ArgMax" bottom: "ip" top: "am" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" }
layer { name: "loss" type: "EuclideanLoss" bottom: "am" bottom: "label" PD }
"""


@pytest.mark.parametrize(
    "force,pd,layer",
    [
        ("", "", "ArgMax"),  # Caffe: NetTest.TestSkipPropagateDown's argmax needs backward
        ("", "propagate_down: false propagate_down: true", None),
        # force_backward runs every layer's Backward: Accuracy's and ArgMax's abort
        ("force_backward: true", "propagate_down: false propagate_down: true", "Accuracy"),
    ],
)
def test_layers_without_a_caffe_backward_refuse_one(tmp_path, force, pd, layer):
    path = tmp_path / "net.prototxt"
    path.write_text(ARGMAX_UNDER_LOSS.replace("FORCE", force).replace("PD", pd))
    net = caffe.Net(str(path), caffe.TRAIN)
    net.forward()
    if layer is None:  # Caffe: NetTest.TestBackwardWithAccuracyLayer
        net.backward()
        return
    with pytest.raises(BlobWiringError, match=rf"\({layer}\)"):
        net.backward()


def test_a_script_may_name_the_net(net, tmp_path):
    """py-faster-rcnn's tools/test_net.py sets ``net.name`` from the caffemodel's file name
    and reads it back for its output folder; pycaffe's Net takes the attribute."""
    net.name = "vgg16_faster_rcnn_iter_70000"
    assert net.name == "vgg16_faster_rcnn_iter_70000"
    net.forward()  # the net runs on unchanged
    net.save(str(tmp_path / "w.caffemodel"))
    assert (
        caffe.proto.caffe_pb2.NetParameter.FromString((tmp_path / "w.caffemodel").read_bytes()).name
        == "testnet"
    )
