"""NetState filtering: phase, level, stage / not_stage, include vs exclude (Caffe's FilterNet)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from torchcaffe.errors import LayerParamError
from torchcaffe.net.state import filter_net, make_state, parse_phase, state_meets_rule
from torchcaffe.proto import caffe_pb2

NET = """
name: "rules"
layer { name: "always" type: "Input" top: "x" }
layer { name: "train_only" type: "ReLU" bottom: "x" top: "a" include { phase: TRAIN } }
layer { name: "not_test" type: "ReLU" bottom: "x" top: "b" exclude { phase: TEST } }
layer { name: "lvl" type: "ReLU" bottom: "x" top: "c" include { min_level: 1 max_level: 2 } }
layer { name: "staged" type: "ReLU" bottom: "x" top: "d" include { stage: "s1" stage: "s2" } }
layer { name: "unstaged" type: "ReLU" bottom: "x" top: "e" include { not_stage: "s1" } }
layer { name: "either" type: "ReLU" bottom: "x" top: "f"
        include { phase: TEST } include { stage: "s2" } }
"""


def names(state) -> list[str]:
    net = text_format.Parse(NET, caffe_pb2.NetParameter())
    return [layer.name for layer in filter_net(net, state).layer]


def test_phase_rules():
    assert names(make_state("train")) == ["always", "train_only", "not_test", "unstaged"]
    assert names(make_state("test")) == ["always", "unstaged", "either"]


def test_level_bounds_are_inclusive():
    assert "lvl" not in names(make_state("train", level=0))
    assert "lvl" in names(make_state("train", level=1))
    assert "lvl" in names(make_state("train", level=2))
    assert "lvl" not in names(make_state("train", level=3))


def test_stage_needs_all_stages_and_not_stage_excludes():
    assert "staged" not in names(make_state("train", stages=["s1"]))
    got = names(make_state("train", stages=["s1", "s2"]))
    assert "staged" in got and "unstaged" not in got and "either" in got


def test_rule_without_conditions_is_met():
    assert state_meets_rule(make_state("test"), caffe_pb2.NetStateRule())


def test_include_and_exclude_together_is_an_error():
    net = text_format.Parse(
        'layer { name: "bad" type: "ReLU" include { phase: TRAIN } exclude { phase: TEST } }',
        caffe_pb2.NetParameter(),
    )
    with pytest.raises(LayerParamError, match=r"layer 'bad' \(ReLU\).*either include"):
        filter_net(net, make_state("train"))


def test_parse_phase_accepts_names_and_enums():
    assert parse_phase("TRAIN") == caffe_pb2.TRAIN and parse_phase(caffe_pb2.TEST) == 1
    with pytest.raises(LayerParamError, match="unknown phase"):
        parse_phase("validate")
