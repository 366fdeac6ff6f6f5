"""A wheel holds every module: each folder of Python files under torchcaffe is a package."""

from __future__ import annotations

from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]


def test_every_source_folder_is_an_installed_package():
    packages = set(find_packages(str(ROOT), include=["torchcaffe*"]))
    folders = {
        str(p.parent.relative_to(ROOT)).replace("/", ".")
        for p in (ROOT / "torchcaffe").rglob("*.py")
    }
    assert folders <= packages, f"folders without __init__.py: {sorted(folders - packages)}"


def test_pycaffe_module_names_are_not_internal_packages():
    """``import torchcaffe as caffe`` leaves ``caffe.io`` and ``caffe.layers`` to pycaffe's
    modules (Transformer & co.; NetSpec's ``L``): whatever answers there is pycaffe's."""
    import importlib

    pycaffe_names = {"io": "Transformer", "layers": "Convolution"}
    for name, pycaffe_attr in pycaffe_names.items():
        try:
            module = importlib.import_module(f"torchcaffe.{name}")
        except ImportError:
            continue
        assert hasattr(module, pycaffe_attr), f"torchcaffe.{name} is not pycaffe's caffe.{name}"
