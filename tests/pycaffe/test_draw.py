"""caffe.draw and ``torchcaffe draw_net`` on a real model (LeNet's train/test prototxt)."""

from __future__ import annotations

import shutil
import sys

import pytest

import torchcaffe as caffe
from torchcaffe.cli.__main__ import main as cli_main
from torchcaffe.errors import UnsupportedError
from torchcaffe.formats.prototxt import read_net

NET = """
name: "small"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "drop" type: "Dropout" bottom: "pool1" top: "pool1" include { phase: TRAIN } }
"""

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` not installed")


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.prototxt"
    path.write_text(NET)
    return read_net(str(path))


def test_graph_has_layers_blobs_and_geometry(small):
    pytest.importorskip("pydot")
    graph = caffe.draw.get_pydot_graph(small, "LR", phase=caffe.TEST)
    text = graph.to_string()
    assert "conv1" in text and "(Convolution)" in text and "stride: 2" in text and "pad: 1" in text
    assert "pool: AVE" in text and "drop" not in text  # Dropout is TRAIN only
    all_phases = caffe.draw.get_pydot_graph(small, "LR").to_string()
    assert "(Dropout)" in all_phases


@needs_dot
def test_draw_net_png_and_svg(small, tmp_path):
    pytest.importorskip("pydot")
    png = caffe.draw.draw_net(small, "TB", "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "small.svg"
    caffe.draw.draw_net_to_file(small, str(out), "LR")
    assert "<svg" in out.read_text() and "pool1" in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.prototxt", "small.svg"]


@needs_dot
def test_cli_draw_net_real_model(models_root, tmp_path, capsys):
    pytest.importorskip("pydot")
    out = tmp_path / "lenet.png"
    model = models_root / "lenet_mnist" / "lenet_train_test.prototxt"
    assert cli_main(["draw_net", str(model), str(out), "--phase", "TRAIN"]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert "drew" in capsys.readouterr().out


def test_missing_pydot_names_the_extra(small, monkeypatch):
    monkeypatch.setitem(sys.modules, "pydot", None)
    with pytest.raises(UnsupportedError, match=r"torchcaffe\[draw\]"):
        caffe.draw.get_pydot_graph(small, "LR")


def test_missing_dot_says_how_to_install(small, monkeypatch):
    monkeypatch.setattr(caffe.draw.shutil, "which", lambda name: None)
    with pytest.raises(UnsupportedError, match="apt-get install graphviz"):
        caffe.draw.draw_net(small, "LR")
