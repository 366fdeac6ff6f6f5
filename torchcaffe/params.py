"""pycaffe's ``caffe.params`` (NetSpec's ``P``): ``params.Pooling.MAX``."""

from __future__ import annotations

from typing import Any

from .net_spec import params as _params


def __getattr__(name: str) -> Any:
    return getattr(_params, name)
