"""Data layers can be fed tensors: feed_data_layers turns them into Input layers."""

from __future__ import annotations

import pytest
import torch

import torchcaffe
from torchcaffe.errors import DataError, UnknownLayerTypeError
from torchcaffe.formats.prototxt import read_net
from torchcaffe.net.feeds import SOURCE_LAYER_TYPES, feed_data_layers

TRAIN_VAL = """
layer { name: "train_db" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        data_param { source: "train_lmdb" batch_size: 8 backend: LMDB } }
layer { name: "test_db" type: "Data" top: "data" top: "label" include { phase: TEST }
        data_param { source: "test_lmdb" batch_size: 4 backend: LMDB } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 } }
layer { name: "relu" type: "ReLU" bottom: "label" top: "label_out" }
"""


def test_data_layer_becomes_input_and_keeps_rules():
    net = feed_data_layers(read_net(TRAIN_VAL), {"data": (2, 5), "label": (2,)})
    for lp in net.layer[:2]:
        assert lp.type == "Input" and list(lp.top) == ["data", "label"]
        assert [list(s.dim) for s in lp.input_param.shape] == [[2, 5], [2]]
    assert net.layer[0].include[0].phase == 0 and net.layer[1].include[0].phase == 1


def test_fed_net_builds_in_both_phases_and_runs():
    for phase in ("train", "test"):
        net = torchcaffe.load(
            read_net(TRAIN_VAL), phase=phase, input_shapes={"data": (2, 5), "label": (2,)}
        )
        assert net.input_names == ["data", "label"]
        out = net(data=torch.ones(2, 5), label=torch.zeros(2))
        assert tuple(out["ip"].shape) == (2, 3)


def test_unfed_data_layer_reads_its_source():
    with pytest.raises(DataError, match=r"layer 'train_db' \(Data\).*'train_lmdb'"):
        torchcaffe.load(read_net(TRAIN_VAL), phase="train")


def test_unimplemented_source_layer_error_says_how_to_feed():
    text = TRAIN_VAL.replace('"train_db" type: "Data"', '"train_db" type: "VideoData"')
    with pytest.raises(
        UnknownLayerTypeError, match=r"layer 'train_db' \(VideoData\).*input_shapes"
    ):
        torchcaffe.load(read_net(text), phase="train")


@pytest.mark.parametrize("layer_type", sorted(SOURCE_LAYER_TYPES))
def test_every_source_layer_type_can_be_fed(layer_type):
    text = TRAIN_VAL.replace('"train_db" type: "Data"', f'"train_db" type: "{layer_type}"')
    net = torchcaffe.load(
        read_net(text), phase="train", input_shapes={"data": (2, 5), "label": (2,)}
    )
    assert net.input_names == ["data", "label"]


def test_partial_shapes_leave_the_layer_alone():
    net = feed_data_layers(read_net(TRAIN_VAL), {"data": (2, 5)})
    assert net.layer[0].type == "Data"
