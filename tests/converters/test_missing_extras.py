"""A converter whose optional package is missing says which extra to install, with an error
that is also an ImportError (as scripts guard optional imports)."""

from __future__ import annotations

import sys

import pytest

from torchcaffe.converters import compare, onnx, safetensors
from torchcaffe.errors import MissingPackageError


@pytest.mark.parametrize(
    "module,call,extra",
    [
        ("cv2", lambda: compare.run_opencv(None, None, None, {}), "opencv"),
        ("onnxruntime", lambda: compare.run_onnxruntime(None, None, None, {}), "onnx"),
        ("safetensors.torch", safetensors._safetensors_torch, "safetensors"),
    ],
)
def test_missing_package_names_the_extra(monkeypatch, module, call, extra):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=rf"torchcaffe\[{extra}\]") as caught:
        call()
    assert isinstance(caught.value, MissingPackageError)


def test_onnx_export_without_onnxscript_names_the_extra(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a, **k: None)
    with pytest.raises(ImportError, match=r"torchcaffe\[onnx\]"):
        onnx._require("onnxscript", "onnx")
