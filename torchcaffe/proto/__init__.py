"""The Caffe schema, generated from ``proto/caffe.proto`` (``python -m torchcaffe.proto.generate``).

``caffe_pb2`` is importable as ``torchcaffe.proto.caffe_pb2`` and, on the Caffe face, as
``caffe.proto.caffe_pb2``.
"""

from . import caffe_pb2

__all__ = ["caffe_pb2"]
