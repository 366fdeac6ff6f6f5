"""CaffeLayer's fast construction (plain attributes set without nn.Module's checks) keeps
what the checked path gave: training flag by phase, only param blobs in the state dict."""

from __future__ import annotations

import pytest

import torchcaffe

PROTO = """
name: "c"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 2 dim: 3 dim: 5 dim: 7 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "drop" type: "Dropout" bottom: "conv" top: "conv" }
"""


@pytest.mark.parametrize("phase, training", [("train", True), ("test", False)])
def test_layers_start_in_their_phases_mode(phase, training):
    net = torchcaffe.load(PROTO, phase=phase)
    assert [m.training for m in net.layers.values()] == [training] * 5
    net.train(not training)  # and nn.Module's mode switch still reaches every layer
    assert [m.training for m in net.layers.values()] == [not training] * 5


def test_only_param_blobs_are_registered():
    net = torchcaffe.load(PROTO)
    conv, bn = net.layer("conv"), net.layer("bn")
    assert set(net.state_dict()) == {
        "layers.conv.weight",
        "layers.conv.bias",
        "layers.bn.mean",
        "layers.bn.variance",
        "layers.bn.scale_factor",
    }
    for layer in (conv, bn):
        for attr in ("layer_param", "name", "phase", "bottom_shapes", "num_tops"):
            assert attr in vars(layer)
            assert attr not in layer._parameters and attr not in layer._buffers
    assert conv.name == "conv" and conv.bottom_shapes == [(2, 3, 5, 7)] and conv.num_tops == 1
    assert conv.param_blobs() == [conv.weight, conv.bias]
    assert conv.weight.std() > 0  # the filler ran


def test_building_leaves_the_callers_net_parameter_as_it_was():
    """The builder completes layers in place (phase, automatic tops, input shapes) in its own
    copy of the net: the message the caller passed is untouched."""
    from torchcaffe.formats.prototxt import parse_net_text

    param = parse_net_text(
        'layer { name: "data" type: "Input" top: "data" top: "label" '
        "input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }\n"
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
        "inner_product_param { num_output: 3 } }\n"
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" }\n'
    )
    before = param.SerializeToString(deterministic=True)
    net = torchcaffe.load(param, phase="train", input_shapes={"data": (4, 3), "label": (4,)})
    assert param.SerializeToString(deterministic=True) == before
    loss = net.layer("loss").layer_param
    assert loss.phase == torchcaffe.proto.caffe_pb2.TRAIN and len(loss.top) == 1
    assert net.blob_shapes["data"] == (4, 3)
