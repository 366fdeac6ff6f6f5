"""``Datum`` records (LMDB/LevelDB values) from bytes, checked before any array is made.

A minimal, dependency-free reading of raw (not encoded) datums, as Caffe's DataTransformer
takes them: ``data`` holds channels*height*width uint8 pixels, else ``float_data`` that many
floats. Encoded datums (an image file in ``data``) need an image decoder and are left to the
data layers. Every problem is a ``DataError`` naming the source.
"""

from __future__ import annotations

import math

import numpy as np
from google.protobuf.message import DecodeError

from .. import limits
from ..errors import DataError
from ..proto import caffe_pb2


def datum_from_bytes(data: bytes, source: str = "<datum>") -> caffe_pb2.Datum:
    """A Datum parsed by protobuf; garbage raises ``DataError``."""
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as err:
        raise DataError(f"not a valid serialized Datum ({err})", path=source) from None
    return datum


def raw_datum_array(datum: caffe_pb2.Datum, source: str = "<datum>") -> np.ndarray:
    """The CxHxW values of a raw datum: uint8 from ``data``, else float32 ``float_data``."""
    if datum.encoded:
        raise DataError("an encoded datum needs an image decoder", path=source)
    shape = (datum.channels, datum.height, datum.width)
    problem = limits.shape_problem(shape)
    if problem or datum.channels <= 0:
        raise DataError(
            f"datum shape {list(shape)}: {problem or 'no channels'}",
            path=source,
            expected="channels > 0, height and width >= 0",
            got=shape,
        )
    count = math.prod(shape)
    if datum.data:
        if len(datum.data) != count:
            raise DataError(
                "datum data size does not match channels*height*width",
                path=source,
                expected=count,
                got=len(datum.data),
            )
        return np.frombuffer(datum.data, np.uint8).reshape(shape)
    if len(datum.float_data) != count:
        raise DataError(
            "datum float_data size does not match channels*height*width",
            path=source,
            expected=count,
            got=len(datum.float_data),
        )
    return np.asarray(datum.float_data, np.float32).reshape(shape)
