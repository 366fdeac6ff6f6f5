"""data/cv.py: OpenCV's decode and resize, with what OpenCV would do to bad input made a
DataError: a header declaring a giant image (refused before decoding), a resize too large."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from torchcaffe import limits
from torchcaffe.data import cv
from torchcaffe.errors import DataError

cv2 = pytest.importorskip("cv2")


def _encoded(ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, np.full((4, 6, 3), 90, np.uint8))
    assert ok
    return buf.tobytes()


def _declaring(ext: str, height: int, width: int) -> bytes:
    """A small image whose header says ``height`` x ``width`` (as a hostile file might)."""
    data = bytearray(_encoded(ext))
    if ext == ".png":
        data[16:24] = struct.pack(">II", width, height)
    else:
        at = next(i for i in range(2, len(data)) if data[i] == 0xFF and data[i + 1] == 0xC0)
        data[at + 5 : at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.mark.parametrize("ext", [".png", ".jpg"])
def test_a_header_declaring_an_image_over_the_limits_is_refused_before_decoding(ext, tmp_path):
    assert cv.decode(_encoded(ext), cv.IMREAD_COLOR, source="db").shape == (4, 6, 3)
    bomb = _declaring(ext, 60000, 60000)
    with pytest.raises(DataError, match="declare a 60000x60000 image: 10800000000 elements"):
        cv.decode(bomb, cv.IMREAD_COLOR, source="db")
    (tmp_path / "bomb").write_bytes(bomb)
    with pytest.raises(DataError, match=r"image '.*bomb' declare a 60000x60000"):
        cv.read(str(tmp_path / "bomb"), cv.IMREAD_COLOR)
    with limits.override(max_blob_elements=100):  # the declared 6x4 of the real one: 72
        assert cv.decode(_encoded(ext), cv.IMREAD_COLOR, source="db").shape == (4, 6, 3)
        with pytest.raises(DataError, match="declare a 4x10 image"):  # 3 x 4 x 10 = 120
            cv.decode(_declaring(ext, 4, 10), cv.IMREAD_COLOR, source="db")
        try:  # one channel when decoded as gray: 80, under the limit (the bytes may not decode)
            cv.decode(_declaring(ext, 4, 20), cv.IMREAD_GRAYSCALE, source="db")
        except DataError as err:
            assert "declare" not in str(err)


def test_a_resize_over_the_limits_or_beyond_opencv_is_a_data_error():
    img = np.zeros((4, 6, 3), np.uint8)
    assert cv.resize(img, 3, 5).shape == (3, 5, 3)
    with pytest.raises(DataError, match="resizing to 100000x100000"):
        cv.resize(img, 100000, 100000)
