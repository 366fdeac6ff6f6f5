"""Caffe's ``Datum`` record: raw uint8 pixels, ``float_data``, or encoded image bytes.

Conversions follow caffe/util/io.cpp: ``image_to_datum`` is CVMatToDatum (HWC BGR -> CHW bytes,
``encoded: false`` written explicitly), encoded records carry only data, label and
``encoded: true`` (ReadImageToDatum / ReadFileToDatum), and decoding is DecodeDatumToCVMat
(IMREAD_COLOR / IMREAD_GRAYSCALE when forced) or DecodeDatumToCVMatNative (IMREAD_UNCHANGED).
"""

from __future__ import annotations

import numpy as np
from google.protobuf.message import DecodeError

from .. import limits
from ..errors import DataError
from ..proto import caffe_pb2 as pb
from . import cv


def parse_datum(value: bytes, *, source: str, key: bytes | str | None = None) -> pb.Datum:
    """A Datum from its serialized bytes; garbage raises DataError naming the DB and key."""
    datum = pb.Datum()
    try:
        datum.ParseFromString(value)
    except (DecodeError, ValueError, RuntimeError) as err:
        raise DataError(
            f"record {_key(key)} is not a valid serialized Datum ({err})", path=source
        ) from None
    return datum


def datum_to_array(
    datum: pb.Datum,
    *,
    force_color: bool = False,
    force_gray: bool = False,
    source: str = "<datum>",
) -> np.ndarray:
    """The datum's values as a CxHxW array: uint8 for pixels (decoded when encoded), float32
    for ``float_data``. ``force_color`` / ``force_gray`` apply to encoded datums only, as in
    Caffe's DataTransformer."""
    if datum.encoded:
        if force_color and force_gray:
            raise DataError("cannot set both force_color and force_gray", path=source)
        if force_color or force_gray:
            flag = cv.IMREAD_COLOR if force_color else cv.IMREAD_GRAYSCALE
        else:
            flag = cv.IMREAD_UNCHANGED
        return cv.hwc_to_chw(cv.decode(datum.data, flag, source=source))
    c, h, w = datum.channels, datum.height, datum.width
    problem = limits.shape_problem((c, h, w))
    if problem or c <= 0 or h < 0 or w < 0:
        raise DataError(
            f"datum has no valid shape{': ' + problem if problem else ''}",
            path=source,
            expected="channels > 0, height and width >= 0",
            got=(c, h, w),
        )
    count = c * h * w
    if datum.data:
        if len(datum.data) != count:
            raise DataError(
                "datum data size does not match channels*height*width",
                path=source,
                expected=count,
                got=len(datum.data),
            )
        return np.frombuffer(datum.data, np.uint8).reshape(c, h, w)
    if len(datum.float_data) != count:
        raise DataError(
            "datum float_data size does not match channels*height*width",
            path=source,
            expected=count,
            got=len(datum.float_data),
        )
    return np.asarray(datum.float_data, np.float32).reshape(c, h, w)


def image_to_datum(img: np.ndarray, label: int = 0) -> pb.Datum:
    """CVMatToDatum + set_label: an HxW or HxWxC uint8 image (OpenCV order) as raw CHW bytes."""
    chw = cv.hwc_to_chw(np.asarray(img))
    if chw.dtype != np.uint8:
        raise DataError("image data type must be unsigned byte", got=str(chw.dtype))
    datum = pb.Datum(channels=chw.shape[0], height=chw.shape[1], width=chw.shape[2])
    datum.data = np.ascontiguousarray(chw).tobytes()
    datum.label = int(label)
    datum.encoded = False
    return datum


def encoded_datum(buf: bytes, label: int = 0) -> pb.Datum:
    """An encoded datum as Caffe's tools write one: data, label, encoded: true (no shape)."""
    datum = pb.Datum()
    datum.data = bytes(buf)
    datum.label = int(label)
    datum.encoded = True
    return datum


def array_to_datum(arr: np.ndarray, label: int | None = None) -> pb.Datum:
    """pycaffe's ``caffe.io.array_to_datum``: a CxHxW array; uint8 goes to ``data``,
    anything else to ``float_data``."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise DataError("array_to_datum needs a CxHxW array", expected="3 axes", got=arr.shape)
    datum = pb.Datum(channels=arr.shape[0], height=arr.shape[1], width=arr.shape[2])
    if arr.dtype == np.uint8:
        datum.data = arr.tobytes()
    else:
        datum.float_data.extend(arr.astype(float).flat)
    if label is not None:
        datum.label = int(label)
    return datum


def _key(key: bytes | str | None) -> str:
    if key is None:
        return "?"
    if isinstance(key, bytes):
        return repr(key.decode("utf-8", "replace"))
    return repr(key)
