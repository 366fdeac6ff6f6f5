"""NetSpec in the manner of pycaffe's test_net_spec.py, through ``import torchcaffe as caffe``."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

import torchcaffe as caffe
from torchcaffe import layers as L
from torchcaffe import params as P
from torchcaffe.proto import caffe_pb2


def lenet(batch_size):
    n = caffe.NetSpec()
    # pycaffe's test uses DummyData (the data issue's layer); Input has the same wiring here
    n.data, n.label = L.Input(
        shape=[dict(dim=[batch_size, 1, 28, 28]), dict(dim=[batch_size, 1, 1, 1])], ntop=2
    )
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(
        n.pool1, kernel_size=5, num_output=50, weight_filler=dict(type="xavier")
    )
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2 = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    return n.to_proto()


def anon_lenet(batch_size):
    data, label = L.Input(
        shape=[dict(dim=[batch_size, 1, 28, 28]), dict(dim=[batch_size, 1, 1, 1])], ntop=2
    )
    conv1 = L.Convolution(data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    pool1 = L.Pooling(conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    ip1 = L.InnerProduct(pool1, num_output=500, weight_filler=dict(type="xavier"))
    relu1 = L.ReLU(ip1, in_place=True)
    ip2 = L.InnerProduct(relu1, num_output=10, weight_filler=dict(type="xavier"))
    return caffe.to_proto(L.SoftmaxWithLoss(ip2, label))


def silent_net():
    n = caffe.NetSpec()
    n.data, n.data2 = L.Input(shape=[dict(dim=[3]), dict(dim=[4, 2])], ntop=2)
    n.silence_data = L.Silence(n.data, ntop=0)
    n.silence_data2 = L.Silence(n.data2, ntop=0)
    return n.to_proto()


def _load(proto, tmp_path, name="net.prototxt"):
    path = tmp_path / name
    path.write_text(str(proto))
    return caffe.Net(str(path), caffe.TEST)


def test_lenet_loads_and_runs(tmp_path):
    net = _load(lenet(7), tmp_path)
    assert len(net.layers) == 9
    assert net.blobs["data"].data.shape == (7, 1, 28, 28)
    assert net.blobs["ip2"].data.shape == (7, 10)
    net.blobs["data"].data[...] = np.random.randn(7, 1, 28, 28)
    net.blobs["label"].data[...] = np.arange(7).reshape(7, 1, 1, 1)
    assert np.isfinite(net.forward()["loss"])


def test_anon_lenet_autonames(tmp_path):
    proto = anon_lenet(5)
    names = [layer.name for layer in proto.layer]
    assert names == [
        "Input1",
        "Convolution1",
        "Pooling1",
        "InnerProduct1",
        "ReLU1",
        "InnerProduct2",
        "SoftmaxWithLoss1",
    ]
    assert list(proto.layer[4].top) == list(proto.layer[4].bottom) == ["InnerProduct1"]
    net = _load(proto, tmp_path)
    assert len(net.layers) == 7


def test_silent_net_ntop_zero(tmp_path):
    proto = silent_net()
    assert [list(layer.top) for layer in proto.layer] == [["data", "data2"], [], []]
    net = _load(proto, tmp_path)
    assert len(net.layers) == 3 and net.outputs == []


def test_dummy_data_filler_lists():
    data, label = L.DummyData(
        shape=[dict(dim=[2, 3]), dict(dim=[2])],
        data_filler=[dict(type="gaussian"), dict(type="constant", value=1)],
        ntop=2,
    )
    layer = caffe.to_proto(data, label).layer[0]
    assert [f.type for f in layer.dummy_data_param.data_filler] == ["gaussian", "constant"]
    assert [list(s.dim) for s in layer.dummy_data_param.shape] == [[2, 3], [2]]


def test_type_error_for_non_top_input():
    with pytest.raises(TypeError, match="input 0 is not a Top"):
        L.Convolution(np.zeros(3), num_output=2)


def test_param_dicts_repeated_and_layer_fields():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 2, 5, 5]))
    n.conv = L.Convolution(
        n.data,
        num_output=3,
        kernel_size=3,
        pad=[1],
        param=[dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0)],
        include=dict(phase=caffe.TEST),
        loss_weight=0.5,
        name="my_conv",
    )
    n.deconv = L.Deconvolution(n.conv, convolution_param=dict(num_output=2, kernel_size=2))
    layer = n.to_proto().layer[1]
    assert layer.name == "my_conv"
    assert [p.lr_mult for p in layer.param] == [1, 2]
    assert layer.include[0].phase == caffe.TEST and list(layer.loss_weight) == [0.5]
    assert list(layer.convolution_param.pad) == [1]
    deconv = n.to_proto().layer[2]
    assert deconv.convolution_param.num_output == 2
    with pytest.raises(AttributeError, match="no_such_field"):
        n2 = caffe.NetSpec()
        n2.x = L.ReLU(n.data, no_such_field=1)
        n2.to_proto()


def test_every_registered_type_builds_its_layer_proto():
    """Each registry type gives a LayerParameter of that type; params land in its message."""
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1]))
    stems = caffe.net_spec.param_name_dict()
    for type_name in caffe.layer_type_list():
        top = getattr(L, type_name)(n.data, ntop=1)
        proto = caffe.to_proto(top)
        layer = proto.layer[-1]
        assert layer.type == type_name and list(layer.bottom) == ["Input1"]
        if type_name in stems:
            field = stems[type_name] + "_param"
            assert layer.HasField(field) is False
    assert stems["Convolution"] == "convolution" and stems["InnerProduct"] == "inner_product"
    assert stems["Deconvolution"] == "convolution"


def test_round_trip_loads_identical_net(tmp_path):
    """What to_proto writes parses back into the same NetParameter and the same Net."""
    proto = lenet(3)
    text = str(proto)
    again = text_format.Parse(text, caffe_pb2.NetParameter())
    assert again == proto
    a = _load(proto, tmp_path, "a.prototxt")
    b = _load(again, tmp_path, "b.prototxt")
    assert a._layer_names == b._layer_names
    assert {k: v.data.shape for k, v in a.blobs.items()} == {
        k: v.data.shape for k, v in b.blobs.items()
    }
    assert [layer.type for layer in a.layers] == [layer.type for layer in b.layers]
    net = caffe.load(str(tmp_path / "a.prototxt"), phase="test")
    assert "ip2" in net.blob_names


def test_params_enums():
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX
    assert P.Eltwise.SUM == caffe_pb2.EltwiseParameter.SUM
    with pytest.raises(AttributeError):
        _ = P.NoSuchLayer.X


def test_missing_top_is_pycaffes_key_error_and_an_attribute_error():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 2]))
    with pytest.raises(KeyError):  # pycaffe looks the name up in its dict of tops
        _ = n.nope
    with pytest.raises(KeyError):
        _ = n["nope"]
    assert not hasattr(n, "nope")
    assert n["data"] is n.data
