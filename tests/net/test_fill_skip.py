"""load(prototxt, weights) runs no filler for a blob the weights file holds, and every filler
for the blobs it does not hold."""

from __future__ import annotations

import pytest
import torch

import torchcaffe
import torchcaffe.ops.base as base

PROTO = """
name: "skip"
input: "data" input_shape { dim: 2 dim: 3 dim: 6 dim: 6 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3
    weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "constant" value: 0.25 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "conv1" top: "ip1"
  inner_product_param { num_output: 5
    weight_filler { type: "constant" value: 0.5 } bias_filler { type: "constant" value: 2 } } }
"""
ONLY_CONV = PROTO.split('layer { name: "ip1"')[0]


@pytest.fixture
def fills(monkeypatch):
    """The shapes fill_ was called for, in call order."""
    calls: list[tuple[int, ...]] = []
    real = base.fill_

    def spy(tensor, param):
        calls.append(tuple(tensor.shape))
        return real(tensor, param)

    monkeypatch.setattr(base, "fill_", spy)
    return calls


def _weights(tmp_path, name: str) -> tuple:
    """A weights file holding conv1 only, with values no filler draws (3.0 and -1.0)."""
    (tmp_path / "conv.prototxt").write_text(ONLY_CONV)
    src = torchcaffe.load(tmp_path / "conv.prototxt")
    with torch.no_grad():
        src.layer("conv1").weight.fill_(3.0)
        src.layer("conv1").bias.fill_(-1.0)
    torchcaffe.save_weights(src, tmp_path / name)
    (tmp_path / "net.prototxt").write_text(PROTO)
    return tmp_path / "net.prototxt", tmp_path / name


@pytest.mark.parametrize("name", ["conv.caffemodel", "conv.caffemodel.h5"])
def test_blobs_in_the_file_skip_their_fillers(tmp_path, fills, name):
    proto, weights = _weights(tmp_path, name)
    fills.clear()
    net = torchcaffe.load(proto, weights)
    assert fills == [(5, 64), (5,)]  # ip1's weight and bias only
    assert torch.equal(net.layer("conv1").weight, torch.full((4, 3, 3, 3), 3.0))
    assert torch.equal(net.layer("conv1").bias, torch.full((4,), -1.0))
    assert torch.equal(net.layer("ip1").weight, torch.full((5, 64), 0.5))
    assert torch.equal(net.layer("ip1").bias, torch.full((5,), 2.0))


def test_without_weights_every_filler_runs(tmp_path, fills):
    proto, _ = _weights(tmp_path, "conv.caffemodel")
    fills.clear()
    net = torchcaffe.load(proto)
    assert fills == [(4, 3, 3, 3), (4,), (5, 64), (5,)]
    assert torch.equal(net.layer("conv1").bias, torch.full((4,), 0.25))


def test_a_failed_load_leaves_no_plan_behind(tmp_path, fills):
    proto, weights = _weights(tmp_path, "conv.caffemodel")
    (tmp_path / "bad.prototxt").write_text(PROTO.replace("num_output: 4", "num_output: 6"))
    with pytest.raises(torchcaffe.errors.WeightsError, match="shape mismatch"):
        torchcaffe.load(tmp_path / "bad.prototxt", weights)
    fills.clear()
    torchcaffe.load(proto)
    assert len(fills) == 4


@pytest.mark.parametrize(("name", "filled"), [("conv.caffemodel", 0), ("conv.caffemodel.h5", 1)])
def test_a_name_given_twice_keeps_the_fillers_of_the_layer_not_filled(tmp_path, name, filled):
    """Two layers named conv1: the copy fills one (Caffe's rule: the first from a binary
    file, the last from HDF5); the other keeps its fillers' values, not zeros."""
    _, weights = _weights(tmp_path, name)
    twice = PROTO.replace(
        'layer { name: "ip1"',
        'layer { name: "conv1" type: "Convolution" bottom: "data" top: "again"\n'
        "  convolution_param { num_output: 4 kernel_size: 3\n"
        '    weight_filler { type: "constant" value: 0.75 }'
        ' bias_filler { type: "constant" value: 0.25 } } }\nlayer { name: "ip1"',
    )
    (tmp_path / "twice.prototxt").write_text(twice)
    net = torchcaffe.load(tmp_path / "twice.prototxt", weights)
    convs = [net.module_of(s) for s in net.steps if s.name == "conv1"]
    assert len(convs) == 2
    assert torch.equal(convs[filled].weight, torch.full((4, 3, 3, 3), 3.0))
    other = convs[1 - filled]
    assert torch.equal(other.bias, torch.full((4,), 0.25))
    if filled == 0:
        assert torch.equal(other.weight, torch.full((4, 3, 3, 3), 0.75))
    else:
        assert other.weight.std() > 0.1  # conv1's gaussian filler (std 0.5) ran


def test_a_missing_or_directory_weights_path_is_a_weights_error(tmp_path):
    proto, _ = _weights(tmp_path, "conv.caffemodel")
    for path in (tmp_path / "nowhere.caffemodel", tmp_path):
        with pytest.raises(
            torchcaffe.errors.WeightsError, match="weights file not found|is a directory"
        ):
            torchcaffe.load(proto, path)
