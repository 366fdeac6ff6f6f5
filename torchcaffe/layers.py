"""pycaffe's ``caffe.layers`` (NetSpec's ``L``): ``layers.Convolution(bottom, num_output=8)``."""

from __future__ import annotations

from typing import Any

from .net_spec import layers as _layers


def __getattr__(name: str) -> Any:
    return getattr(_layers, name)
