"""``caffe.Layer``: the base class of pycaffe Python layers.

A Python layer subclasses it and defines ``setup``, ``reshape``, ``forward`` and ``backward``
over lists of Blobs (numpy ``.data``/``.diff``), exactly as for pycaffe. torchcaffe sets
``param_str`` and ``phase`` before ``setup`` as Caffe's PythonLayer does; ``self.blobs`` holds
the layer's learnable blobs (``self.blobs.add_blob(*shape)``), which become torch parameters.
As in pycaffe, a ``caffe.Net``'s ``layers[i]`` for such a layer is the instance itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..blob import Blob
from ..errors import UnsupportedError
from ..net.state import Phase
from ..proto import caffe_pb2


class BlobVec(list):
    """pycaffe's ``layer.blobs``: a list of Blobs with ``add_blob(*shape)``."""

    def add_blob(self, *shape: int) -> Blob:
        blob = Blob(shape)
        self.append(blob)
        return blob


class Layer:
    """Base of user-written Python layers (pycaffe's ``caffe.Layer``)."""

    def __init__(self, layer_param: caffe_pb2.LayerParameter | None = None) -> None:
        self.layer_param = layer_param or caffe_pb2.LayerParameter()
        self.blobs = BlobVec()
        self.param_str = self.layer_param.python_param.param_str
        self.param_str_ = self.param_str  # caffe-fast-rcnn's name, read by py-faster-rcnn
        self.phase = Phase(self.layer_param.phase)

    @property
    def type(self) -> str:
        return "Python"

    def setup(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        """Check params and bottoms once; default: nothing to set up."""

    def reshape(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        raise UnsupportedError(
            f"Python layer {type(self).__name__} defines no reshape",
            hint="define reshape(self, bottom, top) to shape the tops",
        )

    def forward(self, bottom: Sequence[Blob], top: Sequence[Blob]) -> None:
        raise UnsupportedError(f"Python layer {type(self).__name__} defines no forward")

    def backward(
        self, top: Sequence[Blob], propagate_down: Sequence[bool], bottom: Sequence[Blob]
    ) -> None:
        raise UnsupportedError(
            f"Python layer {type(self).__name__} defines no backward",
            hint="define backward(self, top, propagate_down, bottom), or "
            "stop gradients before it (propagate_down: false)",
        )

    def __repr__(self) -> str:
        extra: Any = self.param_str
        return f"<{type(self).__name__} Python layer param_str={extra!r}>"
