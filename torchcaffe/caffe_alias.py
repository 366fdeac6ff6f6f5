"""Make ``import caffe`` (and ``caffe.io``, ``caffe.proto.caffe_pb2``, ...) resolve to torchcaffe.

For scripts that cannot be edited. ``install_caffe_alias()`` puts torchcaffe in
``sys.modules["caffe"]`` and a meta path finder that answers ``caffe.<x>`` with the module
object ``torchcaffe.<x>`` itself, so each module exists once (no second copy of caffe_pb2's
descriptors, ``caffe.io.Transformer is torchcaffe.io.Transformer``). The optional ``caffe``
shim distribution (``pip install ./shim`` in the torchcaffe checkout) calls it on
``import caffe``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

ALIAS = "caffe"
TARGET = "torchcaffe"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """The target module ran when it was imported; nothing more to do."""


class CaffeAliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``caffe.<x>`` as ``torchcaffe.<x>`` (the same module object)."""

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(ALIAS + "."):
            return None
        real = TARGET + fullname[len(ALIAS) :]
        try:
            found = importlib.util.find_spec(real)
        except (ImportError, ValueError):
            return None
        if found is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(real), is_package=found.submodule_search_locations is not None
        )


def install_caffe_alias() -> ModuleType:
    """Make ``import caffe`` give torchcaffe from now on; returns the torchcaffe module."""
    import torchcaffe

    if not any(isinstance(f, CaffeAliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, CaffeAliasFinder())
    sys.modules[ALIAS] = torchcaffe
    return torchcaffe
