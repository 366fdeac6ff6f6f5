"""`torchcaffe compare`: real models against OpenCV print every layer's top; a perturbed
caffemodel is caught at the layer that was changed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import torchcaffe
from tests.helpers.exports import HEADS_BEFORE_DETECTION
from torchcaffe.cli.__main__ import main
from torchcaffe.formats.prototxt import read_net

cv2 = pytest.importorskip("cv2")
needs_caffe_importer = pytest.mark.skipif(
    not hasattr(cv2.dnn, "readNetFromCaffe"),
    reason=f"OpenCV {cv2.__version__} has no Caffe importer (the test extra pins <5)",
)

REAL = [
    ("lenet_mnist", "lenet.prototxt", "lenet_iter_10000.caffemodel"),
    ("mtcnn_pnet", "det1.prototxt", "det1.caffemodel"),
    ("ultraface_slim320", "slim-320.prototxt", "slim-320.caffemodel"),
]


def _declared_tops(proto):
    net = torchcaffe.load(proto)
    declared = {lp.name for lp in read_net(proto).layer}
    return [(s.name, s.tops[0]) for s in net.steps if not s.is_input and s.name in declared]


@needs_caffe_importer
@pytest.mark.parametrize("folder, proto, weights", REAL, ids=[r[0] for r in REAL])
def test_compare_real_model_against_opencv_prints_every_blob(
    models_root, capsys, folder, proto, weights
):
    proto, weights = models_root / folder / proto, models_root / folder / weights
    assert main(["compare", str(proto), str(weights), "--against", "opencv", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {(r["layer"], r["top"]) for r in report["blobs"]}
    assert set(_declared_tops(proto)) <= rows
    assert report["first_divergent"] is None
    assert all(r["max_rel"] <= 1e-4 for r in report["blobs"])
    assert main(["compare", str(proto), str(weights), "--against", "opencv"]) == 0
    table = capsys.readouterr().out
    for layer, _top in _declared_tops(proto):
        assert any(line.split()[:1] == [layer] for line in table.splitlines()), layer
    assert f"all {len(report['blobs'])} blobs agree with opencv" in table


@needs_caffe_importer
def test_compare_names_first_divergent_layer_of_perturbed_weights(tmp_path, models_root, capsys):
    root = models_root / "lenet_mnist"
    proto = root / "lenet.prototxt"
    net = torchcaffe.load(proto, root / "lenet_iter_10000.caffemodel")
    with torch.no_grad():
        net.layer("ip1").weight[3, :50] += 0.05  # a small change in the middle of the net
    torchcaffe.save_weights(net, tmp_path / "perturbed.caffemodel")
    perturbed = tmp_path / "perturbed.caffemodel"
    original = root / "lenet_iter_10000.caffemodel"
    argv = ["compare", str(proto), str(perturbed), "--against", "opencv"]
    code = main([*argv, "--against-weights", str(original)])
    out = capsys.readouterr().out
    assert code == 1
    assert "first divergence from opencv: layer 'ip1' (InnerProduct), top 'ip1'" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert lines["conv1"].endswith("ok") and lines["pool2"].endswith("ok")
    assert lines["ip1"].endswith("DIVERGES")


def test_compare_against_onnxruntime_with_input_file(tmp_path, models_root, capsys):
    pytest.importorskip("onnxruntime")
    root = models_root / "mtcnn_pnet"
    x = np.random.default_rng(3).uniform(-1, 1, (2, 3, 20, 17)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    argv = ["compare", str(root / "det1.prototxt"), str(root / "det1.caffemodel")]
    argv += ["--against", "onnxruntime", "--input", f"data={tmp_path / 'x.npy'}", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    shapes = {r["layer"]: r["shape"] for r in report["blobs"]}
    assert shapes["conv1"] == [2, 10, 18, 15]
    assert report["first_divergent"] is None and len(report["blobs"]) == 10


def test_compare_against_caffe_refuses_without_reference_pycaffe(models_root, capsys):
    try:
        import caffe  # noqa: F401

        if hasattr(caffe, "_caffe"):
            pytest.skip("a reference pycaffe is importable here")
    except ImportError:
        pass
    root = models_root / "lenet_mnist"
    argv = ["compare", str(root / "lenet.prototxt"), str(root / "lenet_iter_10000.caffemodel")]
    assert main([*argv, "--against", "caffe"]) == 2
    assert "needs a reference pycaffe" in capsys.readouterr().err


def test_compare_bad_input_is_one_line(tmp_path, models_root, capsys):
    root = models_root / "lenet_mnist"
    argv = ["compare", str(root / "lenet.prototxt"), str(root / "lenet_iter_10000.caffemodel")]
    assert main([*argv, "--against", "opencv", "--input", f"data={tmp_path}/none.npy"]) == 2
    assert main([*argv, "--against", "opencv", "--input", "label=x.npy"]) == 2
    err = capsys.readouterr().err
    assert "cannot read the input array" in err and "Traceback" not in err


def test_compare_caffe_engine_steps_layer_by_layer(models_root, capsys, monkeypatch):
    """The `caffe` engine's mechanics (one pycaffe layer at a time, tops by name), run with
    torchcaffe's own pycaffe face standing in for BVLC's module (no fidelity claim)."""
    from torchcaffe.converters import compare as cmp

    monkeypatch.setattr(cmp, "reference_pycaffe", lambda: torchcaffe)
    root = models_root / "mtcnn_pnet"
    argv = ["compare", str(root / "det1.prototxt"), str(root / "det1.caffemodel")]
    assert main([*argv, "--against", "caffe", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["blobs"]) == 10
    assert all(r["max_abs"] == 0.0 for r in report["blobs"])


def test_compare_against_the_dynamo_exporters_graph(models_root, capsys):
    """onnxruntime-dynamo runs the graph ``convert --to onnx`` writes by default: CIFAR-10
    quick's AVE poolings overhang (Caffe rounds up), which that exporter once divided twice."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    root = models_root / "cifar10_quick"
    argv = ["compare", str(root / "cifar10_quick.prototxt")]
    argv += [str(root / "cifar10_quick_iter_5000.caffemodel"), "--against", "onnxruntime-dynamo"]
    assert main(argv) == 0
    assert "all 12 blobs agree with onnxruntime-dynamo" in capsys.readouterr().out


SILENCED = """
name: "silenced"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 1 dim: 4 dim: 3 dim: 3 } } }
layer { name: "slice" type: "Slice" bottom: "data" top: "a" top: "b"
  slice_param { slice_point: 1 } }
layer { name: "silence" type: "Silence" bottom: "b" }
layer { name: "relu" type: "ReLU" bottom: "a" top: "relu" }
"""


@needs_caffe_importer
def test_compare_against_opencv_passes_over_a_silence_layer(tmp_path, capsys):
    """Silence has no top: asking OpenCV for its output and reading tops[0] raised an
    IndexError (a Slice + Silence is how torchcaffe.export crops Caffe's ceil pooling)."""
    proto = tmp_path / "silenced.prototxt"
    proto.write_text(SILENCED)
    weights = tmp_path / "silenced.caffemodel"
    torchcaffe.save_weights(torchcaffe.load(proto), weights)
    assert main(["compare", str(proto), str(weights), "--against", "opencv"]) == 0
    assert "all 2 blobs agree with opencv" in capsys.readouterr().out  # OpenCV: first tops


def test_compare_against_onnxruntime_stops_before_a_detection_output(tmp_path, capsys):
    """An ONNX trace cannot record a layer whose tops' sizes depend on the values (it keeps
    the example's detections): the layers before it are compared, and a warning says where
    it stopped (it traced DetectionOutput and crashed, or 'agreed' on an empty result)."""
    pytest.importorskip("onnxruntime")
    proto = tmp_path / "ssd.prototxt"
    proto.write_text(HEADS_BEFORE_DETECTION.replace("CENTER_SIZE", "CORNER"))  # random priors
    torchcaffe.save_weights(torchcaffe.load(proto), tmp_path / "ssd.caffemodel")
    argv = ["compare", str(proto), str(tmp_path / "ssd.caffemodel"), "--against", "onnxruntime"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [r["layer"] for r in report["blobs"]] == ["loc_act", "conf_act"]
    assert "compared up to layer 'det' (DetectionOutput)" in captured.err
