"""Weights loading never succeeds with wrong numbers (issue 13, findings 1-3 and 6).

Caffe's Blob::ShapeEquals for legacy num/channels/height/width blobs, a warning (or, strict,
an error) for a partial load, all-or-nothing copies, and Caffe's layer choice for duplicate names.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import torchcaffe
from torchcaffe.errors import MissingWeightsError, PartialWeightsWarning, WeightsError
from torchcaffe.formats.prototxt import read_net
from torchcaffe.proto import caffe_pb2

NET = """
name: "small"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" }
                            bias_filler { type: "gaussian" } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" }
                              bias_filler { type: "gaussian" } } }
"""


def build(text: str = NET) -> torchcaffe.TorchNet:
    return torchcaffe.load(read_net(text))


def snapshot(net) -> dict[str, list[np.ndarray]]:
    return {
        n: [b.detach().numpy().copy() for b in net.layer(n).param_blobs()] for n in net.layer_names
    }


def _blob(values: np.ndarray, legacy: tuple[int, ...] | None = None) -> caffe_pb2.BlobProto:
    bp = caffe_pb2.BlobProto()
    if legacy is not None:
        bp.num, bp.channels, bp.height, bp.width = legacy
    else:
        bp.shape.dim.extend(values.shape)
    bp.data.extend(values.ravel().tolist())
    return bp


def _model(layers: dict[str, list[caffe_pb2.BlobProto]]) -> bytes:
    msg = caffe_pb2.NetParameter(name="small")
    for name, blobs in layers.items():
        lp = msg.layer.add(name=name, type="X")
        for b in blobs:
            lp.blobs.add().CopyFrom(b)
    return msg.SerializeToString()


def _full(net) -> dict[str, list[caffe_pb2.BlobProto]]:
    return {
        n: [_blob(b.detach().numpy()) for b in net.layer(n).param_blobs()] for n in ("conv", "ip")
    }


# -- finding 1: ShapeEquals -------------------------------------------------------------------
def test_legacy_dims_with_equal_count_but_other_shape_are_refused(tmp_path):
    # InnerProduct weight (5, 48); a legacy 1x1x48x5 blob has the same count, transposed.
    net = build()
    layers = _full(net)
    w = np.arange(5 * 48, dtype=np.float32)
    layers["ip"][0] = _blob(w, legacy=(1, 1, 48, 5))
    path = tmp_path / "m.caffemodel"
    path.write_bytes(_model(layers))
    with pytest.raises(WeightsError, match=r"layer 'ip'.*param 0.*shape mismatch"):
        torchcaffe.load_weights(net, path)


def test_legacy_dims_count_only_match_refused_for_flat_form(tmp_path):
    net = build()
    layers = _full(net)
    layers["ip"][0] = _blob(np.zeros(5 * 48, np.float32), legacy=(5 * 48, 1, 1, 1))
    path = tmp_path / "m.caffemodel"
    path.write_bytes(_model(layers))
    with pytest.raises(WeightsError, match="shape mismatch"):
        torchcaffe.load_weights(net, path)


def test_legacy_dims_indexed_from_the_end_are_accepted(tmp_path):
    a, b = build(), build()
    layers = {
        n: [
            _blob(t.detach().numpy(), legacy=(1,) * (4 - t.dim()) + tuple(t.shape))
            for t in a.layer(n).param_blobs()
        ]
        for n in ("conv", "ip")
    }
    path = tmp_path / "m.caffemodel"
    path.write_bytes(_model(layers))
    torchcaffe.load_weights(b, path)
    assert torch.equal(a.layer("ip").weight, b.layer("ip").weight)
    assert torch.equal(a.layer("ip").bias, b.layer("ip").bias)


def test_hdf5_weights_need_the_exact_shape(tmp_path):
    import h5py

    net = build()
    path = tmp_path / "m.caffemodel.h5"
    with h5py.File(path, "w") as f:
        g = f.create_group("data/ip")
        g.create_dataset("0", data=np.zeros((1, 1, 5, 48), np.float32))
        g.create_dataset("1", data=np.zeros(5, np.float32))
    with pytest.raises(WeightsError, match=r"layer 'ip'.*param 0.*shape mismatch"):
        torchcaffe.load_weights(net, path, strict=False)


# -- finding 2: partial loads warn (strict: fail) ---------------------------------------------
def _only_conv(tmp_path, net) -> str:
    layers = _full(net)
    del layers["ip"]
    path = tmp_path / "conv_only.caffemodel"
    path.write_bytes(_model(layers))
    return str(path)


def test_partial_load_warns_naming_the_unfilled_layers(tmp_path):
    net = build()
    path = _only_conv(tmp_path, net)
    with pytest.warns(PartialWeightsWarning, match=r"'ip'") as rec:
        torchcaffe.load_weights(net, path)
    text = str(rec[0].message)
    assert path in text and "'conv'" not in text and "'relu'" not in text


def test_partial_load_strict_is_an_error_and_changes_nothing(tmp_path):
    net = build()
    before = snapshot(net)
    path = _only_conv(tmp_path, net)
    with pytest.raises(WeightsError, match=r"'ip'"):
        torchcaffe.load_weights(net, path, strict=True)
    after = snapshot(net)
    for name in before:
        for x, y in zip(before[name], after[name]):
            assert np.array_equal(x, y), name
    with pytest.raises(WeightsError, match=r"'ip'"):
        torchcaffe.load(read_net(NET), path, strict=True)


def test_empty_weights_file_warns(tmp_path):
    path = tmp_path / "empty.caffemodel"
    path.write_bytes(b"")
    with pytest.warns(PartialWeightsWarning, match=r"'conv', 'ip'"):
        torchcaffe.load_weights(build(), path)


def test_full_load_does_not_warn(tmp_path):
    a, b = build(), build()
    path = tmp_path / "m.caffemodel"
    torchcaffe.save_weights(a, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torchcaffe.load_weights(b, path, strict=True)


def test_pycaffe_copy_from_warns_and_can_be_strict(tmp_path):
    net_file = tmp_path / "net.prototxt"
    net_file.write_text(NET)
    net = torchcaffe.Net(str(net_file), torchcaffe.TEST)
    path = _only_conv(tmp_path, net._net)
    with pytest.warns(PartialWeightsWarning):
        net.copy_from(path)
    with pytest.raises(WeightsError):
        net.copy_from(path, strict=True)


# -- finding 3: all-or-nothing ----------------------------------------------------------------
def test_bad_later_record_leaves_every_param_untouched(tmp_path):
    net = build()
    before = snapshot(net)
    layers = _full(build())
    layers["ip"][1] = _blob(np.zeros(6, np.float32))  # wrong bias shape, after a good conv
    path = tmp_path / "m.caffemodel"
    path.write_bytes(_model(layers))
    with pytest.raises(WeightsError, match="layer 'ip'"):
        torchcaffe.load_weights(net, path)
    after = snapshot(net)
    for name in before:
        for x, y in zip(before[name], after[name]):
            assert np.array_equal(x, y), f"layer {name} was overwritten before the error"


def test_bad_hdf5_record_leaves_every_param_untouched(tmp_path):
    import h5py

    net = build()
    before = snapshot(net)
    path = tmp_path / "m.caffemodel.h5"
    src = build()
    with h5py.File(path, "w") as f:
        for name in ("conv", "ip"):
            g = f.create_group(f"data/{name}")
            for i, t in enumerate(src.layer(name).param_blobs()):
                g.create_dataset(str(i), data=t.detach().numpy())
        del f["data/ip/1"]
        f["data/ip"].create_dataset("1", data=np.zeros(7, np.float32))
    with pytest.raises(WeightsError, match="layer 'ip'"):
        torchcaffe.load_weights(net, path)
    after = snapshot(net)
    for name in before:
        for x, y in zip(before[name], after[name]):
            assert np.array_equal(x, y), name


# -- finding 6: duplicate layer names ---------------------------------------------------------
DUP = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 4 } } }
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "a"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" } } }
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "b"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" } } }
"""


def _fcs(net):
    return [net.layers[s.key] for s in net.steps if s.name == "fc"]


def test_duplicate_names_binary_fills_the_first_layer_as_caffe(tmp_path):
    # Caffe's CopyTrainedLayersFrom(NetParameter) searches layer_names_ from the front.
    net = torchcaffe.load(read_net(DUP))
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = tmp_path / "m.caffemodel"
    path.write_bytes(_model({"fc": [_blob(w), _blob(np.ones(3, np.float32))]}))
    second_before = _fcs(net)[1].weight.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PartialWeightsWarning)
        torchcaffe.load_weights(net, path)
    first, second = _fcs(net)
    assert np.array_equal(first.weight.detach().numpy(), w)
    assert torch.equal(second.weight.detach(), second_before)


def test_duplicate_names_hdf5_fills_the_last_layer_as_caffe(tmp_path):
    # Caffe's CopyTrainedLayersFromHDF5 goes through layer_names_index_, where the last wins.
    import h5py

    net = torchcaffe.load(read_net(DUP))
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = tmp_path / "m.caffemodel.h5"
    with h5py.File(path, "w") as f:
        g = f.create_group("data/fc")
        g.create_dataset("0", data=w)
        g.create_dataset("1", data=np.ones(3, np.float32))
    first_before = _fcs(net)[0].weight.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PartialWeightsWarning)
        torchcaffe.load_weights(net, path)
    assert torch.equal(_fcs(net)[0].weight.detach(), first_before)
    assert np.array_equal(_fcs(net)[1].weight.detach().numpy(), w)


@pytest.mark.parametrize("field", ["diff", "double_diff"])
def test_a_diff_of_another_count_is_refused(tmp_path, field):
    """Caffe's Blob::FromProto checks a stored diff's count as it checks the data's."""
    net = build()
    layers = _full(net)
    getattr(layers["ip"][1], field).extend([0.5] * 3)  # a 5-value bias with 3 diff values
    path = tmp_path / "w.caffemodel"
    path.write_bytes(_model(layers))
    with pytest.raises(WeightsError, match="param 1 holds 3 diff values") as info:
        torchcaffe.load_weights(net, path)
    assert info.value.layer == "ip"
    layers["ip"][1].ClearField(field)
    getattr(layers["ip"][1], field).extend([0.5] * 5)  # the full count loads
    path.write_bytes(_model(layers))
    torchcaffe.load_weights(net, path)


def test_a_directory_as_the_weights_is_named_a_directory(tmp_path):
    """Not 'weights file not found': the path is there, it is a folder (a snapshot folder
    given for the caffemodel in it)."""
    with pytest.raises(MissingWeightsError, match="is a directory, not a weights file"):
        torchcaffe.load_weights(build(), tmp_path)
