"""Caffe layer type string -> layer class, as Caffe's LayerRegistry.

The key is the exact V2 type string ("InnerProduct"); V1 enum names are mapped by
``formats/upgrade.py`` and never reach the registry. Registration happens by importing
``torchcaffe.ops`` (an explicit list of modules).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from .errors import RegistryError, UnknownLayerTypeError

if TYPE_CHECKING:
    from .ops.base import CaffeLayer

_LAYERS: dict[str, type[CaffeLayer]] = {}

L = TypeVar("L", bound=type)


def register_layer(caffe_type: str, *, fork: str | None = None) -> Callable[[L], L]:
    """Class decorator: make ``cls`` the implementation of ``caffe_type``.

    ``fork`` names the Caffe fork that defines the type (e.g. "SSD"); None means BVLC Caffe.
    It is set on every registered class, so a subclass never inherits its base's fork.
    """

    def deco(cls: L) -> L:
        if caffe_type in _LAYERS:
            raise RegistryError(
                f"layer type {caffe_type!r} registered by both "
                f"{_LAYERS[caffe_type].__module__} and {cls.__module__}"
            )
        cls.caffe_type = caffe_type  # type: ignore[attr-defined]
        cls.fork = fork  # type: ignore[attr-defined]
        _LAYERS[caffe_type] = cls  # type: ignore[assignment]
        return cls

    return deco


def _ensure_loaded() -> None:
    from . import ops  # noqa: F401  (import registers every layer)


def layer_class(caffe_type: str) -> type[CaffeLayer]:
    """The class registered for ``caffe_type``; UnknownLayerTypeError names close matches."""
    _ensure_loaded()
    try:
        return _LAYERS[caffe_type]
    except KeyError:
        lowered = {k.lower(): k for k in _LAYERS}
        close = difflib.get_close_matches(caffe_type, list(_LAYERS), n=3, cutoff=0.6)
        exact_ci = lowered.get(caffe_type.lower())
        if exact_ci and exact_ci not in close:
            close.insert(0, exact_ci)
        raise UnknownLayerTypeError(caffe_type, close) from None


def layer_type_list() -> list[str]:
    """Every registered Caffe type string, sorted (as caffe.layer_type_list())."""
    _ensure_loaded()
    return sorted(_LAYERS)


def registered_layers() -> dict[str, type[CaffeLayer]]:
    """A copy of the registry, for docs generation and generic tests."""
    _ensure_loaded()
    return dict(_LAYERS)
