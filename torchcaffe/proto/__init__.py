"""The Caffe schema, generated from ``proto/caffe.proto`` (``python -m torchcaffe.proto.generate``).

``caffe_pb2`` is importable as ``torchcaffe.proto.caffe_pb2`` and, on the Caffe face, as
``caffe.proto.caffe_pb2``.
"""

from typing import Any

from google.protobuf.descriptor import Descriptor

from . import caffe_pb2

__all__ = ["caffe_pb2"]


def _resolve_nested_names(cls: Any, descriptor: Descriptor) -> None:
    """Look up every enum, enum value and nested message of ``cls`` (and of its nested
    messages) once. protobuf's upb classes find these on first access and only then put them
    in the class's ``__dict__``; torch 2.11's dynamo read one not yet there wrongly, silently,
    inside a compiled forward (``EltwiseParameter.SUM`` compared unequal to the layer's
    operation, so a SUM compiled as MAX in a fresh process). Resolved here, every layer's
    comparison with a schema constant reads a plain class attribute, on every torch."""
    for enum in descriptor.enum_types:
        getattr(cls, enum.name)
        for value in enum.values:
            getattr(cls, value.name)
    for nested in descriptor.nested_types:
        _resolve_nested_names(getattr(cls, nested.name), nested)


for _name, _descriptor in caffe_pb2.DESCRIPTOR.message_types_by_name.items():
    _resolve_nested_names(getattr(caffe_pb2, _name), _descriptor)
