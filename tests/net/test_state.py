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


STAGED_FILE = """
state { phase: TRAIN level: 3 stage: "deploy" }
input: "data" input_shape { dim: 1 dim: 2 }
layer { name: "prob" type: "Softmax" bottom: "data" top: "prob" include { stage: "deploy" } }
layer { name: "both" type: "ReLU" bottom: "data" top: "r"
  include { stage: "deploy" stage: "extra" } }
layer { name: "high" type: "ReLU" bottom: "data" top: "h" include { min_level: 3 } }
layer { name: "train" type: "ReLU" bottom: "data" top: "t" include { phase: TRAIN } }
"""


def test_a_files_own_stages_stay_and_the_given_ones_are_added(tmp_path):
    """Caffe's Net(file, phase, level, stages): the file's ``state`` keeps its stages, the
    given stages are added, the given phase and level (default 0) replace the file's."""
    import torchcaffe
    import torchcaffe as caffe

    proto = tmp_path / "net.prototxt"
    proto.write_text(STAGED_FILE)
    assert torchcaffe.load(proto).layer_names == ["input", "prob"]
    both = torchcaffe.load(proto, stages=["extra"]).layer_names
    assert both == ["input", "data_input_0_split", "prob", "both"]
    assert caffe.Net(str(proto), caffe.TEST).outputs == ["prob"]
    assert caffe.Net(str(proto), caffe.TEST, level=3).outputs == ["h", "prob"]


def test_one_string_of_stages_is_refused_by_the_torch_face_and_split_as_pycaffe_does(tmp_path):
    """``stages="deploy"`` would be six one-letter stages: the torch face refuses it rather
    than pick the training layers; the Caffe face splits it as pycaffe's loop over the
    string does."""
    import torchcaffe
    import torchcaffe as caffe
    from torchcaffe.errors import UsageError

    proto = tmp_path / "net.prototxt"
    proto.write_text(STAGED_FILE)
    with pytest.raises(UsageError, match="not one string"):
        torchcaffe.load(proto, stages="extra")
    with pytest.raises(UsageError, match="not one string"):
        torchcaffe.TorchNet(text_format.Parse(STAGED_FILE, caffe_pb2.NetParameter()), stages="x")
    net = caffe.Net(str(proto), caffe.TEST, stages="extra")
    assert list(net.module.state.stage) == ["deploy", "e", "x", "t", "r", "a"]
    assert net.outputs == ["prob"]


OWN_PHASES = """
input: "data" input_shape { dim: 4 dim: 3 dim: 2 dim: 2 }
layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" phase: TRAIN }
layer { name: "drop" type: "Dropout" bottom: "data" top: "drop" phase: TRAIN
  dropout_param { dropout_ratio: 0.5 } }
layer { name: "keep" type: "Dropout" bottom: "data" top: "keep" phase: TEST
  dropout_param { dropout_ratio: 0.5 } }
"""


@pytest.mark.parametrize("phase", ["test", "train"])
def test_a_layer_keeps_the_phase_its_prototxt_sets(phase):
    """Caffe gives a layer the net's phase only where the layer sets none: BatchNorm in TRAIN
    normalizes by the batch's statistics, Dropout in TRAIN drops, in TEST passes x on; the
    net's ``train()``/``eval()`` leave those layers in their own phase."""
    import torch

    import torchcaffe

    net = torchcaffe.load(text_format.Parse(OWN_PHASES, caffe_pb2.NetParameter()), phase=phase)
    x = torch.rand(4, 3, 2, 2) * 3 + 2  # mean ~3.5: global stats (0, 1) would keep it
    for mode in (True, False):
        net.train(mode)
        with torch.no_grad():
            out = net(data=x)
        batch_mean = out["bn"].mean(dim=(0, 2, 3))
        assert batch_mean.abs().max() < 1e-5
        assert (out["drop"] == 0).any() and torch.equal(out["keep"], x)
        assert net.layer("bn").training and not net.layer("keep").training
