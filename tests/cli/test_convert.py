"""`torchcaffe convert`: every --to target from real files, a PyTorch factory, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcaffe
from torchcaffe.cli.__main__ import main

FACTORY = """
import torch
from torch import nn

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 3 * 3, 5)).eval()
"""


@pytest.fixture
def lenet(models_root):
    root = models_root / "lenet_mnist"
    return root / "lenet.prototxt", root / "lenet_iter_10000.caffemodel"


def test_convert_pytorch_factory_to_caffe(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_models.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    args = ["convert", "my_models:make", "--to", "caffe", "--input-shape", "2,3,8,8", "-o", "net"]
    assert main(args) == 0
    assert "wrote net.prototxt" in capsys.readouterr().out
    net = torchcaffe.load(tmp_path / "net.prototxt", tmp_path / "net.caffemodel")
    import my_models  # type: ignore[import-not-found]

    x = torch.randn(2, 3, 8, 8)
    want = my_models.make()(x)
    torch.testing.assert_close(next(iter(net(data=x).values())), want, rtol=1e-5, atol=1e-5)


def test_convert_state_dict_and_safetensors_and_back(tmp_path, lenet):
    proto, weights = lenet
    pytest.importorskip("safetensors")
    for target, name in (("state_dict", "w.pt"), ("safetensors", "w.safetensors")):
        out = tmp_path / name
        assert main(["convert", str(proto), str(weights), "--to", target, "-o", str(out)]) == 0
        back = tmp_path / f"{name}.caffemodel"
        assert main(["convert", str(proto), str(out), "--to", "caffe", "-o", str(back)]) == 0
        a = torchcaffe.load(proto, weights).state_dict()
        b = torchcaffe.load(proto, back).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    state = torch.load(tmp_path / "w.pt", weights_only=True)
    assert "conv1.weight" in state and "ip2.bias" in state


def test_convert_to_onnx(tmp_path, lenet):
    ort = pytest.importorskip("onnxruntime")
    proto, weights = lenet
    out = tmp_path / "lenet.onnx"
    args = ["convert", str(proto), str(weights), "--to", "onnx", "-o", str(out)]
    assert main([*args, "--onnx-exporter", "torchscript"]) == 0
    x = np.random.default_rng(0).uniform(-1, 1, (4, 1, 28, 28)).astype(np.float32)
    got = ort.InferenceSession(str(out)).run(["prob"], {"data": x})[0]
    want = torchcaffe.load(proto, weights)(data=torch.from_numpy(x))["prob"].detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nope_pkg_xyz:make", "--to", "caffe", "--input-shape", "1,3"], "cannot import"),
        (["os:getcwd", "--to", "caffe", "--input-shape", "1,3"], "did not give an nn.Module"),
        (["os:sep", "--to", "onnx"], "converts --to caffe only"),
    ],
)
def test_convert_errors_are_one_line(tmp_path, capsys, argv, message):
    assert main(["convert", *argv, "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())
