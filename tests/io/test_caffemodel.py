"""Weights I/O: V2/V1/V0 binaries, HDF5, by-name loading, shape errors, bit-exact round trips."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import torchcaffe
from torchcaffe.errors import WeightsError
from torchcaffe.formats import caffemodel
from torchcaffe.formats.prototxt import read_net
from torchcaffe.proto import caffe_pb2

NET = """
name: "small"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" }
                            bias_filler { type: "gaussian" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 7 weight_filler { type: "gaussian" }
                              bias_filler { type: "gaussian" } } }
"""


def build(text: str = NET) -> torchcaffe.TorchNet:
    return torchcaffe.load(read_net(text))


def params_of(net) -> dict[str, list[np.ndarray]]:
    return {
        name: [b.detach().numpy().copy() for b in net.layer(name).param_blobs()]
        for name in net.layer_names
    }


def assert_same_params(a, b) -> None:
    pa, pb = params_of(a), params_of(b)
    for name in pa:
        for x, y in zip(pa[name], pb[name]):
            assert x.shape == y.shape
            assert x.tobytes() == y.tobytes(), f"layer {name} changed"


def test_save_then_load_is_bit_exact(tmp_path):
    a, b = build(), build()
    path = tmp_path / "m.caffemodel"
    torchcaffe.save_weights(a, path)
    filled = torchcaffe.load_weights(b, path)
    assert filled == ["data", "conv", "ip"]
    assert_same_params(a, b)


def test_resave_of_unchanged_model_is_byte_identical(tmp_path):
    a = build()
    first, second = tmp_path / "1.caffemodel", tmp_path / "2.caffemodel"
    torchcaffe.save_weights(a, first)
    b = torchcaffe.load(read_net(NET), first)
    torchcaffe.save_weights(b, second)
    assert first.read_bytes() == second.read_bytes()


def test_saved_file_is_a_caffe_netparameter(tmp_path):
    a = build()
    path = tmp_path / "m.caffemodel"
    torchcaffe.save_weights(a, path)
    msg = caffe_pb2.NetParameter.FromString(path.read_bytes())
    assert msg.name == "small"
    conv = [lp for lp in msg.layer if lp.name == "conv"][0]
    assert list(conv.blobs[0].shape.dim) == [4, 3, 3, 3]
    np.testing.assert_array_equal(
        np.array(conv.blobs[0].data, np.float32), a.layer("conv").weight.detach().numpy().ravel()
    )
    assert conv.convolution_param.num_output == 4
    # protobuf re-serializes our bytes identically: fields are in canonical order
    assert msg.SerializeToString() == path.read_bytes()


def test_hdf5_round_trip(tmp_path):
    a, b = build(), build()
    path = tmp_path / "m.caffemodel.h5"
    torchcaffe.save_weights(a, path)
    assert caffemodel.is_hdf5(path)
    torchcaffe.load_weights(b, path)
    assert_same_params(a, b)


def test_layers_absent_from_net_are_ignored(tmp_path):
    bigger = (
        NET
        + """
layer { name: "extra" type: "InnerProduct" bottom: "ip" top: "extra"
        inner_product_param { num_output: 2 } }
"""
    )
    path = tmp_path / "big.caffemodel"
    torchcaffe.save_weights(build(bigger), path)
    small = build()
    assert "extra" not in torchcaffe.load_weights(small, path)


def test_shape_mismatch_names_layer_param_and_both_shapes(tmp_path):
    path = tmp_path / "m.caffemodel"
    torchcaffe.save_weights(build(), path)
    other = build(NET.replace("num_output: 7", "num_output: 8"))
    with pytest.raises(WeightsError) as info:
        torchcaffe.load_weights(other, path)
    text = str(info.value)
    assert str(path) in text and "layer 'ip'" in text and "param 0" in text
    assert "(8, 48)" in text and "(7, 48)" in text and "rename the layer" in text


def test_blob_count_mismatch(tmp_path):
    path = tmp_path / "m.caffemodel"
    torchcaffe.save_weights(build(), path)
    nobias = build(NET.replace("num_output: 7", "num_output: 7 bias_term: false"))
    with pytest.raises(WeightsError, match=r"layer 'ip'.*number of blobs.*expected 1, got 2"):
        torchcaffe.load_weights(nobias, path)


def test_missing_file_and_garbage_file(tmp_path):
    net = build()
    with pytest.raises(WeightsError, match="not found"):
        torchcaffe.load_weights(net, tmp_path / "nope.caffemodel")
    junk = tmp_path / "junk.caffemodel"
    junk.write_bytes(b"\xff\xff\xff\xff not a protobuf")
    with pytest.raises(WeightsError, match=str(junk)):
        torchcaffe.load_weights(net, junk)


def _v1_weights(net, legacy_4d: bool) -> bytes:
    """A V1 (``layers``) NetParameter with legacy num/channels/height/width blobs."""
    msg = caffe_pb2.NetParameter(name="small")
    for name, v1type in (
        ("conv", caffe_pb2.V1LayerParameter.CONVOLUTION),
        ("ip", caffe_pb2.V1LayerParameter.INNER_PRODUCT),
    ):
        layer = msg.layers.add(name=name, type=v1type)
        for blob in net.layer(name).param_blobs():
            bp = layer.blobs.add()
            values = blob.detach().numpy()
            if legacy_4d:
                shape = (1,) * (4 - values.ndim) + values.shape
                bp.num, bp.channels, bp.height, bp.width = shape
            else:
                bp.shape.dim.extend(values.shape)
            bp.data.extend(values.ravel().tolist())
    return msg.SerializeToString()


@pytest.mark.parametrize("legacy_4d", [True, False])
def test_v1_binary_weights(tmp_path, legacy_4d):
    a, b = build(), build()
    path = tmp_path / "v1.caffemodel"
    path.write_bytes(_v1_weights(a, legacy_4d))
    assert torchcaffe.load_weights(b, path) == ["conv", "ip"]
    assert_same_params(a, b)


def test_legacy_4d_shape_with_equal_count_only_is_refused(tmp_path):
    # Caffe's Blob::ShapeEquals compares legacy (num, channels, height, width) with the target
    # shape indexed from the end (1x1xOxI for an InnerProduct weight); an equal count alone is
    # not enough (issue 13: a count-only match loaded transposed weights silently).
    a, b = build(), build()
    msg = caffe_pb2.NetParameter()
    layer = msg.layer.add(name="ip", type="InnerProduct")
    for blob in a.layer("ip").param_blobs():
        bp = layer.blobs.add()
        values = blob.detach().numpy()
        bp.num, bp.channels, bp.height, bp.width = (values.size, 1, 1, 1)
        bp.data.extend(values.ravel().tolist())
    path = tmp_path / "legacy.caffemodel"
    path.write_bytes(msg.SerializeToString())
    with pytest.raises(WeightsError, match="shape mismatch"):
        torchcaffe.load_weights(b, path)


def test_v0_binary_weights(tmp_path):
    a, b = build(), build()
    msg = caffe_pb2.NetParameter(name="small")
    for name, v0type in (("conv", "conv"), ("ip", "innerproduct")):
        conn = msg.layers.add()
        conn.layer.name, conn.layer.type = name, v0type
        for blob in a.layer(name).param_blobs():
            bp = conn.layer.blobs.add()
            values = blob.detach().numpy()
            bp.num, bp.channels, bp.height, bp.width = (1,) * (4 - values.ndim) + values.shape
            bp.data.extend(values.ravel().tolist())
    path = tmp_path / "v0.caffemodel"
    path.write_bytes(msg.SerializeToString())
    assert torchcaffe.load_weights(b, path) == ["conv", "ip"]
    assert_same_params(a, b)


def test_double_data_blobs_load(tmp_path):
    a, b = build(), build()
    msg = caffe_pb2.NetParameter()
    layer = msg.layer.add(name="ip", type="InnerProduct")
    for blob in a.layer("ip").param_blobs():
        bp = layer.blobs.add()
        bp.shape.dim.extend(blob.shape)
        bp.double_data.extend(blob.detach().double().numpy().ravel().tolist())
    path = tmp_path / "double.caffemodel"
    path.write_bytes(msg.SerializeToString())
    torchcaffe.load_weights(b, path)
    np.testing.assert_array_equal(
        b.layer("ip").bias.detach().numpy(), a.layer("ip").bias.detach().numpy()
    )


def test_float64_net_saves_double_data(tmp_path):
    a = build().double()
    path = tmp_path / "d.caffemodel"
    torchcaffe.save_weights(a, path)
    msg = caffe_pb2.NetParameter.FromString(path.read_bytes())
    ip = [lp for lp in msg.layer if lp.name == "ip"][0]
    assert len(ip.blobs[0].double_data) == 7 * 48 and not ip.blobs[0].data
    b = build().double()
    torchcaffe.load_weights(b, path)
    assert_same_params(a, b)


def test_write_diff(tmp_path):
    a = build()
    a(data=torch.randn(2, 3, 6, 5))["ip"].sum().backward()
    path = tmp_path / "diff.caffemodel"
    torchcaffe.save_weights(a, path, write_diff=True)
    msg = caffe_pb2.NetParameter.FromString(path.read_bytes())
    ip = [lp for lp in msg.layer if lp.name == "ip"][0]
    np.testing.assert_array_equal(
        np.array(ip.blobs[1].diff, np.float32), a.layer("ip").bias.grad.numpy()
    )


def test_failed_save_leaves_previous_file_untouched(tmp_path, monkeypatch):
    path = tmp_path / "m.caffemodel"
    torchcaffe.save_weights(build(), path)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(caffemodel, "_blob_chunks", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        torchcaffe.save_weights(build(), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.caffemodel"], "temporary file left behind"


@pytest.mark.slow
def test_file_over_protobuf_2gb_limit_loads(tmp_path):
    """A 2.2 GB caffemodel (over protobuf's message limit) loads with one copy of the weights."""
    n_out, n_in = 33, 17_000_000  # 561M floats = 2.24 GB
    text = (
        'layer { name: "data" type: "Input" top: "data" '
        f"input_param {{ shape {{ dim: 1 dim: {n_in} }} }} }}\n"
        'layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" '
        f"inner_product_param {{ num_output: {n_out} bias_term: false }} }}\n"
    )
    net = torchcaffe.load(read_net(text))
    with torch.no_grad():
        net.layer("fc").weight[:, :4] = torch.arange(n_out * 4, dtype=torch.float32).view(n_out, 4)
        net.layer("fc").weight[:, -1] = -1.0
    path = tmp_path / "huge.caffemodel"
    torchcaffe.save_weights(net, path)
    assert path.stat().st_size > 2**31
    with pytest.raises(Exception):  # noqa: B017 - protobuf refuses the message itself
        caffe_pb2.NetParameter.FromString(path.read_bytes())
    fresh = torchcaffe.load(read_net(text))
    with torch.no_grad():
        fresh.layer("fc").weight.zero_()
    torchcaffe.load_weights(fresh, path)
    assert torch.equal(fresh.layer("fc").weight[:, :4], net.layer("fc").weight[:, :4])
    assert bool((fresh.layer("fc").weight[:, -1] == -1).all())


def test_zero_axis_blob_is_saved_without_a_shape(tmp_path):
    """Blob::ToProto adds shape dims one by one, so a 0-axis blob (PReLU channel_shared's
    slope) is written with no shape field at all, not an empty one; it loads back."""
    text = """
        layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
        layer { name: "prelu" type: "PReLU" bottom: "data" top: "out"
                prelu_param { channel_shared: true } }
        """
    a = build(text)
    path = tmp_path / "m.caffemodel"
    torchcaffe.save_weights(a, path)
    blob = caffe_pb2.NetParameter.FromString(path.read_bytes()).layer[1].blobs[0]
    assert not blob.HasField("shape") and len(blob.data) == 1
    b = build(text)
    torchcaffe.load_weights(b, path)
    assert_same_params(a, b)


GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SAVED_BY_CAFFE = sorted(
    p.parent for p in GOLDEN.glob("*/*/weights.caffemodel") if (p.parent / "net.prototxt").exists()
)


@pytest.mark.parametrize("case", SAVED_BY_CAFFE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_save_writes_the_bytes_caffes_net_save_wrote(case, tmp_path):
    """Each golden weights.caffemodel was written by Caffe's Net::Save: loading it into the
    case's net and saving again gives the same bytes (layer params as LayerSetUp left them:
    a loss layer's loss_weight 1, BatchNorm's lr_mult 0 ParamSpecs, the split layers)."""
    import torchcaffe as caffe

    meta = json.loads((case / "meta.json").read_text())
    phase = caffe.TRAIN if meta["phase"] == "TRAIN" else caffe.TEST
    net = caffe.Net(str(case / "net.prototxt"), str(case / "weights.caffemodel"), phase)
    out = tmp_path / "resaved.caffemodel"
    net.save(str(out))
    want = (case / "weights.caffemodel").read_bytes()
    got = out.read_bytes()
    if got != want:  # show the first layer that differs, not two megabytes of floats
        a, b = (caffe_pb2.NetParameter.FromString(x) for x in (want, got))
        assert [lp.name for lp in a.layer] == [lp.name for lp in b.layer]
        for la, lb in zip(a.layer, b.layer):
            assert la == lb, f"layer {la.name!r}"
        assert a == b
        assert got == want


def test_save_leaves_out_automatic_tops(tmp_path):
    """A loss layer without a top gets one from Net::Init (AutoTopBlobs), which Caffe does
    not list in the layer's own parameter: the saved layer has no top, and loss_weight 1."""
    net = build(
        """
        layer { name: "data" type: "Input" top: "data" top: "label"
                input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }
        layer { name: "loss" type: "SoftmaxWithLoss" bottom: "data" bottom: "label" }
        """
    )
    path = tmp_path / "m.caffemodel"
    torchcaffe.save_weights(net, path)
    loss = caffe_pb2.NetParameter.FromString(path.read_bytes()).layer[1]
    assert list(loss.top) == [] and list(loss.loss_weight) == [1.0]


def test_unnamed_net_is_saved_with_an_empty_name(tmp_path):
    """Net::ToProto calls set_name(name_) whatever the name: a net without one is written
    with an empty name field (2 bytes), which protobuf's parser reports as present."""
    net = build(NET.replace('name: "small"', ""))
    path = tmp_path / "m.caffemodel"
    torchcaffe.save_weights(net, path)
    data = path.read_bytes()
    assert data[:2] == b"\x0a\x00"
    assert caffe_pb2.NetParameter.FromString(data).HasField("name")


def test_hdf5_save_refuses_a_layer_name_with_a_slash(tmp_path):
    """Caffe's ToHDF5 cannot create /data/inception_3a/1x1 (H5Gcreate2 makes no intermediate
    group) and aborts; h5py would nest it, and neither Caffe nor load_weights would read it
    back as that layer. A clear error, and no file."""
    net = build(NET.replace('name: "conv"', 'name: "block/conv"'))
    path = tmp_path / "m.caffemodel.h5"
    with pytest.raises(WeightsError, match="holds '/'") as err:
        torchcaffe.save_weights(net, path)
    assert "block/conv" in str(err.value)
    assert os.listdir(tmp_path) == []
