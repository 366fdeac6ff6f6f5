"""A wheel holds every module: each folder of Python files under torchcaffe is a package."""

from __future__ import annotations

from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]


def test_every_source_folder_is_an_installed_package():
    packages = set(find_packages(str(ROOT), include=["torchcaffe*"]))
    folders = {str(p.parent.relative_to(ROOT)).replace("/", ".")
               for p in (ROOT / "torchcaffe").rglob("*.py")}
    assert folders <= packages, f"folders without __init__.py: {sorted(folders - packages)}"
