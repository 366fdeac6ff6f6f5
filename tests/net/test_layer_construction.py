"""CaffeLayer's fast construction keeps what nn.Module's checked path gives: training flag by
phase, only param blobs in the state dict, torch's rules for params, buffers and submodules.
A net is built with the cycle collector paused."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import torchcaffe
from torchcaffe.net import net as net_module
from torchcaffe.ops.base import CaffeLayer

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


def test_plain_attributes_skip_nn_modules_setattr(monkeypatch):
    """The fast path fired: building a net sets no plain value through nn.Module.__setattr__
    (its Parameter and Buffer isinstance hooks run in Python, ~1 us each)."""
    seen: list[str] = []
    checked = nn.Module.__setattr__

    def counting(self, name, value):
        if isinstance(self, CaffeLayer) and not isinstance(value, (torch.Tensor, nn.Module)):
            seen.append(f"{self.name}.{name}")
        checked(self, name, value)

    monkeypatch.setattr(nn.Module, "__setattr__", counting)
    net = torchcaffe.load(PROTO)
    assert seen == []
    assert net.layer("conv").num_output == 4 and "num_output" in vars(net.layer("conv"))


def test_setattr_keeps_torchs_rules_for_params_buffers_and_modules():
    net = torchcaffe.load(PROTO)
    conv, bn = net.layer("conv"), net.layer("bn")
    with pytest.raises(TypeError, match="parameter"):
        conv.weight = 3.0  # a param name takes only a Parameter (or None), as in torch
    with pytest.raises(TypeError, match="buffer"):
        bn.mean = [0.0]  # a buffer name takes only a tensor (or None)
    new = nn.Parameter(torch.zeros_like(conv.weight))
    conv.weight = new
    assert conv._parameters["weight"] is new and "weight" not in vars(conv)
    bn.mean = torch.ones(4)
    assert torch.equal(bn._buffers["mean"], torch.ones(4)) and "mean" not in vars(bn)
    conv.helper = nn.Identity()  # a submodule registers, and a plain value may not replace it
    assert "helper" in conv._modules
    with pytest.raises(TypeError, match="module"):
        conv.helper = 1
    conv.weight = None  # None keeps the name registered, as in torch
    assert "weight" in conv._parameters and conv.weight is None


def _build_calls(monkeypatch) -> list[tuple[bool, int]]:
    """(collector enabled, collections started) for each build_net call during the test."""
    calls: list[tuple[bool, int]] = []
    started = [0]

    def count(phase, info):
        started[0] += phase == "start"

    real = net_module.build_net

    def watched(*args, **kwargs):
        started[0] = 0
        try:
            return real(*args, **kwargs)
        finally:
            calls.append((gc.isenabled(), started[0]))

    monkeypatch.setattr(net_module, "build_net", watched)
    gc.callbacks.append(count)  # the caller pops it
    return calls


def _chain(n: int) -> str:
    return (
        'layer { name: "data" type: "Input" top: "x0" input_param { shape { dim: 1 } } }\n'
        + "".join(
            f'layer {{ name: "r{i}" type: "ReLU" bottom: "x{i}" top: "x{i + 1}" }}\n'
            for i in range(n)
        )
    )


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_build_runs_with_the_collector_paused(monkeypatch, collector_on):
    """A 300-layer build allocates thousands of objects, which would start collections (full
    passes walk every live object); paused, none starts, and the collector is back after."""
    calls = _build_calls(monkeypatch)
    try:
        torchcaffe.load(_chain(300))
    finally:
        gc.callbacks.pop()
    assert calls == [(False, 0)]
    assert gc.isenabled()


def test_a_failed_build_restores_the_collector_and_a_disabled_one_stays_off(
    monkeypatch, collector_on
):
    _build_calls(monkeypatch)
    try:
        with pytest.raises(torchcaffe.TorchCaffeError):
            torchcaffe.load(
                _chain(3) + 'layer { name: "bad" type: "ReLU" bottom: "nope" top: "y" }'
            )
        assert gc.isenabled()
        gc.disable()
        torchcaffe.load(_chain(3))
        assert not gc.isenabled()
    finally:
        gc.callbacks.pop()
        gc.enable()
