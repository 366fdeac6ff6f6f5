"""Implicit Split layers: names, counts and loss-weight handling as Caffe's InsertSplits."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from torchcaffe.errors import BlobWiringError
from torchcaffe.net.splits import insert_splits
from torchcaffe.proto import caffe_pb2


def parse(text: str) -> caffe_pb2.NetParameter:
    return text_format.Parse(text, caffe_pb2.NetParameter())


def test_no_split_for_single_reader():
    net = parse(
        'layer { name: "in" type: "Input" top: "x" } '
        'layer { name: "r" type: "ReLU" bottom: "x" top: "y" }'
    )
    assert insert_splits(net) == net


def test_split_names_and_rewired_bottoms():
    net = parse(
        'layer { name: "in" type: "Input" top: "x" } '
        'layer { name: "a" type: "ReLU" bottom: "x" top: "y" } '
        'layer { name: "b" type: "ReLU" bottom: "x" top: "z" }'
    )
    out = insert_splits(net)
    assert [l.name for l in out.layer] == ["in", "x_in_0_split", "a", "b"]
    split = out.layer[1]
    assert split.type == "Split" and list(split.bottom) == ["x"]
    assert list(split.top) == ["x_in_0_split_0", "x_in_0_split_1"]
    assert out.layer[2].bottom[0] == "x_in_0_split_0"
    assert out.layer[3].bottom[0] == "x_in_0_split_1"


def test_in_place_readers_split_the_last_producer():
    net = parse(
        'layer { name: "in" type: "Input" top: "x" } '
        'layer { name: "r" type: "ReLU" bottom: "x" top: "x" } '
        'layer { name: "a" type: "ReLU" bottom: "x" top: "y" } '
        'layer { name: "b" type: "ReLU" bottom: "x" top: "z" }'
    )
    out = insert_splits(net)
    assert [l.name for l in out.layer] == ["in", "r", "x_r_0_split", "a", "b"]


def test_weighted_top_read_once_gets_split_carrying_the_weight():
    net = parse(
        'layer { name: "in" type: "Input" top: "x" } '
        'layer { name: "l" type: "ReLU" bottom: "x" top: "y" loss_weight: 2 } '
        'layer { name: "c" type: "ReLU" bottom: "y" top: "z" }'
    )
    out = insert_splits(net)
    producer, split, reader = out.layer[1], out.layer[2], out.layer[3]
    assert list(producer.loss_weight) == []
    assert split.name == "y_l_0_split" and list(split.loss_weight) == [2.0, 0.0]
    assert list(split.top) == ["y_l_0_split_0", "y_l_0_split_1"]
    assert list(reader.bottom) == ["y_l_0_split_1"]  # split 0 carries the loss


def test_unknown_bottom_names_layer_and_index():
    net = parse('layer { name: "r" type: "ReLU" bottom: "nope" top: "y" }')
    with pytest.raises(BlobWiringError, match=r"layer 'r' \(ReLU\): unknown bottom blob 'nope'"):
        insert_splits(net)
