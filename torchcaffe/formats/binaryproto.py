"""``BlobProto`` files (``mean.binaryproto``, blob vectors) and BlobProto <-> numpy.

Shapes follow Caffe's ``Blob::FromProto``: the legacy num/channels/height/width fields, when any
is set, give a 4-D shape; otherwise ``shape.dim``. Values come from ``double_data`` when it is
non-empty, else ``data``. Large arrays go in and out as packed bytes, not per-element.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

import numpy as np

from .. import limits
from ..errors import DataError
from ..proto import caffe_pb2 as pb
from . import wire
from .prototxt import read_binary_proto, write_binary

PathLike = str | os.PathLike

_LEGACY = ("num", "channels", "height", "width")
# BlobProto field numbers of the packed value fields.
_DATA = pb.BlobProto.DATA_FIELD_NUMBER
_DIFF = pb.BlobProto.DIFF_FIELD_NUMBER
_DOUBLE_DATA = pb.BlobProto.DOUBLE_DATA_FIELD_NUMBER
_DOUBLE_DIFF = pb.BlobProto.DOUBLE_DIFF_FIELD_NUMBER


def blob_proto_shape(proto: pb.BlobProto) -> tuple[int, ...]:
    """The shape Caffe's FromProto gives a blob: legacy 4-D when any legacy field is set."""
    if any(proto.HasField(f) for f in _LEGACY):
        return (proto.num, proto.channels, proto.height, proto.width)
    return tuple(int(d) for d in proto.shape.dim)


def blob_proto_to_array(
    proto: pb.BlobProto, *, diff: bool = False, path: PathLike | None = None
) -> np.ndarray:
    """The blob's data (or diff) as an array of its shape.

    float32 from ``data``, float64 from ``double_data`` (preferred when present, as Caffe's
    FromProto). A value count that does not match the shape raises ``DataError``, as does a
    stored diff's (Caffe's FromProto checks both).
    """
    shape = blob_proto_shape(proto)
    problem = limits.shape_problem(shape)
    if problem:
        raise DataError(
            f"blob proto shape {limits.shape_text(shape)}: {problem}",
            path=_name(path),
            hint="see docs/limits.md to raise a limit for a file you trust",
        )
    doubles, floats = (proto.double_diff, proto.diff) if diff else (proto.double_data, proto.data)
    values = (
        np.asarray(doubles, dtype=np.float64)
        if len(doubles)
        else np.asarray(floats, dtype=np.float32)
    )
    count = math.prod(shape)
    if values.size != count:
        field = ("double_" if len(doubles) else "") + ("diff" if diff else "data")
        raise DataError(
            f"blob proto {field} size does not match its shape {list(shape)}",
            path=_name(path),
            expected=f"{count} values",
            got=values.size,
        )
    stored_diff = len(proto.double_diff) or len(proto.diff)
    if not diff and stored_diff and stored_diff != count:  # Caffe's FromProto checks it too
        raise DataError(
            f"blob proto diff size does not match its shape {list(shape)}",
            path=_name(path),
            expected=f"{count} values",
            got=stored_diff,
        )
    return values.reshape(shape)


def array_to_blob_proto(
    arr: np.ndarray, diff: np.ndarray | None = None, *, legacy_4d: bool = False
) -> pb.BlobProto:
    """A ``BlobProto`` holding ``arr`` (and ``diff``), as Caffe's Blob::ToProto writes one.

    float64 arrays go to ``double_data``/``double_diff``, anything else to float32 ``data``.
    ``legacy_4d`` writes num/channels/height/width (left-padded with 1s, at most 4 axes), as
    old tools and pycaffe's ``array_to_blobproto`` do, instead of ``shape``.
    """
    arr = np.asarray(arr)
    if diff is not None:
        diff = np.asarray(diff)
        if diff.shape != arr.shape:
            raise DataError(
                "diff shape differs from data shape", expected=arr.shape, got=diff.shape
            )
    proto = pb.BlobProto()
    if legacy_4d:
        if arr.ndim > 4:
            raise DataError(
                "the legacy num/channels/height/width shape holds at most 4 axes",
                expected="<= 4 axes",
                got=arr.shape,
            )
        proto.num, proto.channels, proto.height, proto.width = (1,) * (4 - arr.ndim) + arr.shape
    elif arr.ndim:  # Blob::ToProto adds dims one by one: a 0-axis blob gets no shape field
        proto.shape.dim.extend(int(d) for d in arr.shape)
    double = arr.dtype == np.float64
    chunks = [_packed(_DOUBLE_DATA if double else _DATA, arr, double)]
    if diff is not None:
        chunks.append(_packed(_DOUBLE_DIFF if double else _DIFF, diff, double))
    proto.MergeFromString(b"".join(chunks))
    return proto


def _packed(number: int, values: np.ndarray, double: bool) -> bytes:
    raw = np.ascontiguousarray(values, dtype="<f8" if double else "<f4").tobytes()
    return wire.len_field_header(number, len(raw)) + raw if raw else b""


def _name(path: PathLike | None) -> str | None:
    return None if path is None else os.fspath(path)


# -- files ------------------------------------------------------------------------------------


def read_blob_proto(path: PathLike) -> pb.BlobProto:
    """A binary ``BlobProto`` file (e.g. mean.binaryproto)."""
    return read_binary_proto(path, pb.BlobProto)


def write_blob_proto(blob: pb.BlobProto | np.ndarray, path: PathLike) -> None:
    """Write a ``BlobProto`` (or an array, with its N-d shape), atomically."""
    if not isinstance(blob, pb.BlobProto):
        blob = array_to_blob_proto(blob)
    write_binary(blob, path)


def read_mean_file(path: PathLike) -> np.ndarray:
    """A mean.binaryproto as an array of its stored shape (compute_image_mean: 1xCxHxW)."""
    return blob_proto_to_array(read_blob_proto(path), path=path)


def read_blob_proto_vector(path: PathLike) -> pb.BlobProtoVector:
    """A binary ``BlobProtoVector`` file."""
    return read_binary_proto(path, pb.BlobProtoVector)


def write_blob_proto_vector(
    blobs: pb.BlobProtoVector | Iterable[pb.BlobProto | np.ndarray], path: PathLike
) -> None:
    """Write a ``BlobProtoVector`` (or one built from protos/arrays), atomically."""
    if not isinstance(blobs, pb.BlobProtoVector):
        vector = pb.BlobProtoVector()
        for blob in blobs:
            vector.blobs.append(
                blob if isinstance(blob, pb.BlobProto) else array_to_blob_proto(blob)
            )
        blobs = vector
    write_binary(blobs, path)
