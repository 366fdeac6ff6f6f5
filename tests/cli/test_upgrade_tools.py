"""upgrade_net_proto_text / upgrade_net_proto_binary (Caffe's tools) and `upgrade`, which
keeps the form of its input (a binary caffemodel no longer comes out as text)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchcaffe
from torchcaffe.cli.__main__ import main
from torchcaffe.formats.prototxt import parse_net_text, read_net_binary, read_net_text

V1_MODELS = [
    ("lenet_mnist", "lenet.prototxt", "lenet_iter_10000.caffemodel"),
    ("cifar10_quick", "cifar10_quick.prototxt", "cifar10_quick_iter_5000.caffemodel"),
]


@pytest.mark.parametrize("folder, proto, weights", V1_MODELS)
def test_upgrade_net_proto_binary_writes_v2_with_same_weights(
    tmp_path, models_root, folder, proto, weights
):
    src = models_root / folder / weights
    assert read_net_binary(src).layers, "the shared model should be a V1 binary"
    out = tmp_path / "v2.caffemodel"
    assert main(["upgrade_net_proto_binary", str(src), str(out)]) == 0
    upgraded = read_net_binary(out)
    assert len(upgraded.layer) and not len(upgraded.layers)
    assert all(lp.type and not lp.type.isupper() for lp in upgraded.layer)  # V2 type strings
    net_proto = models_root / folder / proto
    want = torchcaffe.load(net_proto, src).state_dict()
    got = torchcaffe.load(net_proto, out).state_dict()
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key


def test_upgrade_keeps_binary_binary(tmp_path, models_root):
    src = models_root / "lenet_mnist" / "lenet_iter_10000.caffemodel"
    out = tmp_path / "out.bin"  # no telling extension: the form follows the input
    assert main(["upgrade", str(src), str(out)]) == 0
    assert len(read_net_binary(out).layer) == len(read_net_binary(src).layers)
    assert out.stat().st_size < 1.1 * src.stat().st_size


def test_upgrade_net_proto_text(tmp_path, models_root, capsys):
    src = models_root / "lenet_v0" / "lenet.prototxt"
    out = tmp_path / "v2.prototxt"
    assert main(["upgrade_net_proto_text", str(src), str(out)]) == 0
    net = read_net_text(out)
    types = [lp.type for lp in net.layer]
    assert {"Convolution", "Pooling", "InnerProduct", "ReLU"} <= set(types), types
    assert not len(net.layers)
    logged = capsys.readouterr()  # Caffe's tool LOGs (glog, stderr), printing nothing
    assert logged.out == "" and f"] Wrote upgraded NetParameter text proto to {out}\n" in logged.err
    again = tmp_path / "again.prototxt"
    assert main(["upgrade_net_proto_text", str(out), str(again)]) == 0
    assert f"] File already in latest proto format: {out}\n" in capsys.readouterr().err
    assert read_net_text(again) == net


@pytest.mark.parametrize(
    "tool, src",
    [
        ("upgrade_net_proto_text", "lenet_mnist/lenet_iter_10000.caffemodel"),
        ("upgrade_net_proto_binary", "lenet_mnist/lenet.prototxt"),
    ],
)
def test_wrong_form_is_refused_and_nothing_written(tmp_path, models_root, capsys, tool, src):
    out = tmp_path / "out"
    assert main([tool, str(models_root / src), str(out)]) == 2
    err = capsys.readouterr().err
    assert "not " in err and "use `torchcaffe upgrade_net_proto_" in err
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("case", ["v0_padding_net", "v1_conv_net"])
def test_upgraded_text_is_caffes_byte_for_byte(case, tmp_path):
    """Caffe's upgrade_net_proto_text output (golden/legacy): its C++ TextFormat prints an
    integral float as ``1``, Python's as ``1.0``."""
    golden = Path(__file__).resolve().parents[1] / "golden" / "legacy" / case
    (source,) = [p for p in golden.glob("*.prototxt") if p.name != "upgraded.prototxt"]
    out = tmp_path / "up.prototxt"
    assert main(["upgrade_net_proto_text", str(source), str(out)]) == 0
    assert out.read_bytes() == (golden / "upgraded.prototxt").read_bytes()


V0_RELU_WITH_NUM_OUTPUT = """name: "v0"
input: "data" input_dim: 1 input_dim: 1 input_dim: 4 input_dim: 4
layers { layer { name: "r" type: "relu" num_output: 3 } bottom: "data" top: "r" }
"""


@pytest.mark.parametrize("tool", ["upgrade_net_proto_text", "upgrade"])
def test_v0_field_the_layer_does_not_take_exits_1_after_writing(tmp_path, capsys, tool):
    """Caffe's UpgradeV0LayerParameter logs "Unknown parameter num_output for layer type relu"
    and returns false; upgrade_net_proto_text still writes the file and returns !success."""
    src, out = tmp_path / "v0.prototxt", tmp_path / "v2.prototxt"
    src.write_text(V0_RELU_WITH_NUM_OUTPUT)
    assert main([tool, str(src), str(out)]) == 1
    err = capsys.readouterr().err
    assert "'num_output'" in err and "Encountered error(s) while upgrading" in err
    assert [lp.type for lp in read_net_text(out).layer] == ["Input", "ReLU"]


def test_v0_binary_with_a_stray_field_exits_1(tmp_path):
    net = parse_net_text(V0_RELU_WITH_NUM_OUTPUT)
    src, out = tmp_path / "v0.caffemodel", tmp_path / "v2.caffemodel"
    src.write_bytes(net.SerializeToString())
    assert main(["upgrade_net_proto_binary", str(src), str(out)]) == 1
    assert [lp.type for lp in read_net_binary(out).layer] == ["Input", "ReLU"]


def test_v0_net_fields_dropped_by_the_upgrade_exit_0(tmp_path, capsys):
    """UpgradeV0Net keeps only name, layers, input, input_dim and force_backward, silently: we
    warn about the rest, but Caffe's tool reports success."""
    src, out = tmp_path / "v0.prototxt", tmp_path / "v2.prototxt"
    src.write_text(
        V0_RELU_WITH_NUM_OUTPUT.replace(" num_output: 3", "") + "state { phase: TEST }\n"
    )
    assert main(["upgrade_net_proto_text", str(src), str(out)]) == 0
    assert "drops net field(s) state" in capsys.readouterr().err


@pytest.mark.parametrize("tool", ["upgrade_net_proto_text", "upgrade"])
def test_text_net_with_a_typo_reports_its_line_whatever_the_extension(tmp_path, capsys, tool):
    """A text net with an unknown extension (deploy.prototxt.old) that does not parse is a text
    error at its line, as Caffe's ReadProtoFromTextFile reports it, not "a binary proto"."""
    src, out = tmp_path / "deploy.prototxt.old", tmp_path / "out"
    src.write_text('name: "x"\nlayers { name: "c" type: CONVOLUTON }\n')
    assert main([tool, str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{src}:2:" in err and "CONVOLUTON" in err and "binary" not in err
    assert not out.exists()
