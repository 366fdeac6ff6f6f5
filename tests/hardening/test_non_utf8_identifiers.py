"""A stray non-UTF-8 byte where a prototxt enum value belongs is a PrototxtError with its line
and column, not protobuf's SystemError (found by the long fuzz run of prototxt text)."""

from __future__ import annotations

import pytest

import torchcaffe
from torchcaffe.errors import PrototxtError

HEAD = b'layer { name: "in" type: "Input" top: "d" input_param { shape { dim: 1 dim: 1 } } }\n'


@pytest.mark.parametrize(
    "line",
    [
        b'layer { name: "p" type: "Pooling" bottom: "d" top: "p" pooling_param { pool: \x80 } }',
        b'layer { name: "r" type: "ReLU" bottom: "d" top: "r" include { phase: \xffTRAIN } }',
    ],
)
def test_non_utf8_byte_as_an_enum_value(tmp_path, line):
    path = tmp_path / "net.prototxt"
    path.write_bytes(HEAD + line + b"\n")
    with pytest.raises(PrototxtError, match="enum value holds bytes that are not UTF-8") as info:
        torchcaffe.load(str(path))
    err = info.value
    assert str(path) in str(err)
    assert (err.line, err.column) == (2, line.index(b":", line.rindex(b"{")) + 3)


def test_non_utf8_bytes_in_comments_and_strings_still_load(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_bytes(b"# caf\xe9 (latin-1 comment)\n" + HEAD)
    assert torchcaffe.load(str(path)).blob_shapes["d"] == (1, 1)
