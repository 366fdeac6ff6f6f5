"""OpenCV, imported on demand: image decoding and resizing exactly as Caffe's io.cpp does them.

Caffe decodes with ``cv::imdecode`` / ``cv::imread`` (BGR channel order, libpng's own RGB->gray
for IMREAD_GRAYSCALE) and resizes with ``cv::resize`` (INTER_LINEAR, OpenCV's bit-exact 8-bit
path); ``cv2`` calls the same code, so the pixels match.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DataError, UnsupportedError

IMREAD_UNCHANGED = -1  # DecodeDatumToCVMatNative's flag
IMREAD_GRAYSCALE = 0
IMREAD_COLOR = 1


def cv2() -> Any:
    """The cv2 module, or a clear error naming the extra that installs it."""
    try:
        import cv2 as module
    except ImportError:
        raise UnsupportedError(
            "reading or writing images needs OpenCV, which is not installed",
            hint="pip install 'torchcaffe[image]' (opencv-python-headless)",
        ) from None
    return module


def decode(buf: bytes, flag: int, *, source: str) -> np.ndarray:
    """``cv::imdecode``: HxW (gray) or HxWxC (BGR) uint8; undecodable bytes raise DataError."""
    img = cv2().imdecode(np.frombuffer(buf, np.uint8), flag) if buf else None
    if img is None:
        raise DataError(
            "cannot decode the encoded image bytes", path=source, expected="a JPEG/PNG/... image"
        )
    return _check_depth(img, source)


def read(filename: str, flag: int, *, source: str | None = None) -> np.ndarray:
    """``cv::imread`` of one file (a missing or unreadable image raises DataError)."""
    try:
        with open(filename, "rb") as f:
            buf = f.read()
    except OSError as err:
        raise DataError(
            f"cannot open image {filename!r} ({err.strerror})",
            path=source,
            expected="an image file",
        ) from None
    img = cv2().imdecode(np.frombuffer(buf, np.uint8), flag) if buf else None
    if img is None:
        raise DataError(
            f"cannot decode image {filename!r}", path=source, expected="a JPEG/PNG/... image"
        )
    return _check_depth(img, filename)


def resize(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """``cv::resize(img, Size(width, height))`` with the default INTER_LINEAR."""
    m = cv2()
    return m.resize(img, (width, height), interpolation=m.INTER_LINEAR)


def encode(img: np.ndarray, ext: str, *, source: str) -> bytes:
    """``cv::imencode("." + ext, img)`` with OpenCV's default quality settings."""
    cv = cv2()
    try:
        ok, buf = cv.imencode("." + ext, img)
    except cv.error:  # no encoder for that extension (Caffe's tool dies on the exception)
        ok = False
    if not ok:
        raise DataError(f"OpenCV cannot encode as {ext!r}", path=source, expected="jpg, png, ...")
    return buf.tobytes()


def _check_depth(img: np.ndarray, source: str) -> np.ndarray:
    if img.dtype != np.uint8:
        raise DataError(
            "image data type must be unsigned byte (Caffe's DataTransformer)",
            path=source,
            expected="8-bit image",
            got=str(img.dtype),
        )
    return img


def hwc_to_chw(img: np.ndarray) -> np.ndarray:
    """OpenCV's HxW or HxWxC to Caffe's CxHxW (a view)."""
    if img.ndim == 2:
        return img[None]
    return img.transpose(2, 0, 1)
