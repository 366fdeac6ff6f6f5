"""OpenCV, imported on demand: image decoding and resizing exactly as Caffe's io.cpp does them.

Caffe decodes with ``cv::imdecode`` / ``cv::imread`` (BGR channel order, libpng's own RGB->gray
for IMREAD_GRAYSCALE) and resizes with ``cv::resize`` (INTER_LINEAR, OpenCV's bit-exact 8-bit
path); ``cv2`` calls the same code, so the pixels match.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from .. import limits
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
    img = _imdecode(buf, flag, "the encoded image bytes", source)
    if img is None:
        raise DataError(
            "cannot decode the encoded image bytes", path=source, expected="a JPEG/PNG/... image"
        )
    return _check_depth(img, source)


def _imdecode(buf: bytes, flag: int, what: str, source: str | None) -> np.ndarray | None:
    """``cv2.imdecode``, or None for empty or undecodable bytes. A PNG or JPEG whose header
    declares an image over the blob limits (a few KB can declare 60000x60000) is refused
    before OpenCV allocates it, and an error OpenCV raises is a DataError."""
    if not buf:
        return None
    declared = _declared_size(buf)
    if declared is not None:
        problem = limits.shape_problem((1 if flag == IMREAD_GRAYSCALE else 3, *declared))
        if problem:
            raise DataError(
                f"{what} declare a {declared[0]}x{declared[1]} image: {problem}",
                path=source,
                hint="see docs/limits.md to raise a limit for data you trust",
            )
    cv = cv2()
    try:
        return cv.imdecode(np.frombuffer(buf, np.uint8), flag)
    except cv.error as err:
        reason = str(err).strip().splitlines()[-1]
        raise DataError(f"OpenCV cannot decode {what} ({reason})", path=source) from None


def _declared_size(buf: bytes) -> tuple[int, int] | None:
    """(height, width) a PNG's IHDR or a JPEG's SOF marker declares, read before decoding;
    None for other formats or a header cut short."""
    if buf[:8] == b"\x89PNG\r\n\x1a\n" and buf[12:16] == b"IHDR" and len(buf) >= 24:
        width, height = struct.unpack(">II", buf[16:24])
        return height, width
    if buf[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 9 <= len(buf) and buf[i] == 0xFF:
        marker = buf[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
        elif 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # start of frame
            height, width = struct.unpack(">HH", buf[i + 5 : i + 9])
            return height, width
        else:
            i += 2 + int.from_bytes(buf[i + 2 : i + 4], "big")
    return None


def read(filename: str, flag: int, *, source: str | None = None) -> np.ndarray:
    """``cv::imread`` of one file (a missing or unreadable image raises DataError)."""
    try:
        with open(filename, "rb") as f:
            buf = f.read()
    except (OSError, ValueError) as err:  # ValueError: a name holding a NUL byte
        reason = err.strerror if isinstance(err, OSError) else "a file name cannot hold NUL"
        raise DataError(
            f"cannot open image {filename!r} ({reason})",
            path=source,
            expected="an image file",
        ) from None
    img = _imdecode(buf, flag, f"image {filename!r}", source)
    if img is None:
        raise DataError(
            f"cannot decode image {filename!r}", path=source, expected="a JPEG/PNG/... image"
        )
    return _check_depth(img, filename)


def resize(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """``cv::resize(img, Size(width, height))`` with the default INTER_LINEAR; a size over
    the blob limits, or one OpenCV cannot make, is a DataError."""
    channels = 1 if img.ndim == 2 else img.shape[2]
    problem = limits.shape_problem((channels, height, width))
    if problem:
        raise DataError(
            f"resizing to {height}x{width}: {problem}",
            hint="see docs/limits.md to raise a limit for data you trust",
        )
    m = cv2()
    try:
        return m.resize(img, (width, height), interpolation=m.INTER_LINEAR)
    except m.error as err:
        reason = str(err).strip().splitlines()[-1]
        raise DataError(f"OpenCV cannot resize to {height}x{width} ({reason})") from None


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
