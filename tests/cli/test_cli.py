"""The command line: run, layers, upgrade; errors are one clear line, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

import torchcaffe
from torchcaffe.cli.__main__ import READS_NETS, main
from torchcaffe.formats.prototxt import read_net
from torchcaffe.ops.catalogue import supported_layers_markdown

REPO = Path(__file__).resolve().parents[2]
NET = """
name: "tiny"
input: "data"
input_shape { dim: 1 dim: 2 dim: 5 dim: 5 }
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv"
         convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
"""


def test_run_prints_outputs_and_saves(tmp_path, capsys):
    proto = tmp_path / "tiny.prototxt"
    proto.write_text(NET)
    out = tmp_path / "tiny.caffemodel"
    assert main(["run", str(proto), "--save", str(out)]) == 0
    text = capsys.readouterr().out
    assert "net 'tiny': 3 layers" in text and "conv" in text and "(1, 3, 3, 3)" in text
    assert torchcaffe.load_weights(torchcaffe.load(proto), out) == ["input", "conv", "relu"]


def test_run_with_input_shape_override(tmp_path, capsys):
    proto = tmp_path / "tiny.prototxt"
    proto.write_text(NET)
    assert main(["run", str(proto), "--input", "data=2,2,7,7"]) == 0
    assert "(2, 3, 5, 5)" in capsys.readouterr().out


def test_errors_are_one_line(tmp_path, capsys):
    proto = tmp_path / "bad.prototxt"
    proto.write_text(NET + 'layers { name: "x" type: RELU bottom: "nope" top: "y" }')
    assert main(["run", str(proto)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchcaffe run: error: ") and "layer 'x'" in err
    assert "Traceback" not in err


def test_upgrade_writes_v2_text(tmp_path):
    old, new = tmp_path / "old.prototxt", tmp_path / "new.prototxt"
    old.write_text(NET)
    assert main(["upgrade", str(old), str(new)]) == 0
    text = new.read_text()
    assert 'type: "Convolution"' in text and 'type: "Input"' in text and "layers {" not in text
    assert read_net(new) == read_net(old)


def test_supported_layers_doc_is_current():
    committed = (REPO / "docs" / "supported_layers.md").read_text()
    assert committed == supported_layers_markdown(), (
        "docs/supported_layers.md is stale: run `torchcaffe layers --out docs/supported_layers.md`"
    )


def test_layers_table_lists_every_registered_type(capsys):
    assert main(["layers"]) == 0
    text = capsys.readouterr().out
    for name in torchcaffe.layer_type_list():
        assert f"| {name} |" in text


def test_run_on_a_device_this_machine_lacks_is_one_line(tmp_path, capsys):
    import torch

    proto = tmp_path / "tiny.prototxt"
    proto.write_text(NET)
    bad = ["foo"] + ([] if torch.cuda.is_available() else ["cuda"])
    for device in bad:
        assert main(["run", str(proto), "--device", device]) == 2
        err = capsys.readouterr().err
        assert f"--device {device}: not a device of this machine" in err
        assert "Traceback" not in err


def test_run_input_naming_no_input_blob_is_an_error(tmp_path, capsys):
    proto = tmp_path / "tiny.prototxt"
    proto.write_text(NET)
    assert main(["run", str(proto), "--input", "foo=1,2,5,5"]) == 2
    assert "input_shapes names ['foo']" in capsys.readouterr().err


def test_ctrl_c_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    import torchcaffe.cli.run as run

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(
        __import__("torchcaffe.cli.__main__", fromlist=["ACTIONS"]).ACTIONS,
        "run",
        (run.add_arguments, interrupted),
    )
    proto = tmp_path / "tiny.prototxt"
    proto.write_text(NET)
    assert main(["run", str(proto)]) == 130
    err = capsys.readouterr().err
    assert err == "torchcaffe run: interrupted\n"


def test_top_level_help_gives_each_action_its_whole_first_sentence(capsys):
    """`torchcaffe -h` lists each action by its docstring's first paragraph; a first sentence
    that runs over two lines ("upgrade ...: text in, text out; binary in, binary out.") is
    not cut at the line break."""
    with pytest.raises(SystemExit):
        main(["-h"])
    listing = " ".join(capsys.readouterr().out.split())
    assert "text in, text out; binary (a caffemodel) in, binary out." in listing
    assert "(a caffemodel, weights kept) to the current format, written as binary." in listing


def test_forks_doc_names_every_action_that_takes_caffe_proto():
    """docs/forks.md lists the actions with --caffe-proto; each one the CLI gives it is there."""
    text = (REPO / "docs" / "forks.md").read_text()
    line = " ".join(text.split("On the command line, ", 1)[1].split("take", 1)[0].split())
    assert sorted(READS_NETS) == sorted(w.strip("`,") for w in line.split() if w != "and")
