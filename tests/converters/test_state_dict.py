"""caffemodel -> state_dict -> caffemodel keeps every blob bit-exact."""

from __future__ import annotations

import pytest
import torch

import torchcaffe
from torchcaffe.converters import caffemodel_to_state_dict, state_dict_to_caffemodel
from torchcaffe.errors import WeightsError

NET = """
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" } } }
"""


def test_round_trip_is_bit_exact(tmp_path):
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET)
    original = torchcaffe.load(proto)
    torchcaffe.save_weights(original, tmp_path / "a.caffemodel")
    caffemodel_to_state_dict(proto, tmp_path / "a.caffemodel", tmp_path / "a.pt")
    state = torch.load(tmp_path / "a.pt", weights_only=True)
    assert torch.equal(state["layers.conv.weight"], original.layer("conv").weight)
    state_dict_to_caffemodel(proto, tmp_path / "a.pt", tmp_path / "b.caffemodel")
    assert (tmp_path / "a.caffemodel").read_bytes() == (tmp_path / "b.caffemodel").read_bytes()


def test_mismatched_state_dict_is_a_weights_error(tmp_path):
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET)
    torch.save({"layers.other.weight": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(WeightsError, match="does not fit"):
        state_dict_to_caffemodel(proto, tmp_path / "bad.pt", tmp_path / "x.caffemodel")
