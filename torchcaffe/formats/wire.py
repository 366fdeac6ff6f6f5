"""Minimal protobuf wire-format reader/writer for the parts of a caffemodel that can be huge.

Python protobuf parses a message into memory in one piece and refuses messages over 2 GB, so
weights are streamed: this module walks fields over a memoryview (an mmap of the file) and
hands back packed float arrays as zero-copy numpy views. Small sub-messages (a layer's
non-blob fields) are still parsed by protobuf itself.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import WireError

VARINT, I64, LEN, I32 = 0, 1, 2, 5


def read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def iter_fields(
    buf: memoryview, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, int, int, int, int]]:
    """Yield (field_number, wire_type, value_or_start, value_end, field_start) per field.

    For VARINT the third item is the value; for LEN/I32/I64 it is the payload's start offset
    and the fourth its end. ``field_start`` is where the tag begins (for re-slicing).
    """
    pos = start
    end = len(buf) if end is None else end
    while pos < end:
        field_start = pos
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at offset {field_start}")
        if wire == VARINT:
            value, pos = read_varint(buf, pos)
            yield number, wire, value, pos, field_start
        elif wire == LEN:
            length, pos = read_varint(buf, pos)
            if pos + length > end:
                raise WireError(
                    f"length-delimited field {number} runs past the end "
                    f"(offset {field_start}, length {length})"
                )
            yield number, wire, pos, pos + length, field_start
            pos += length
        elif wire == I32:
            if pos + 4 > end:
                raise WireError("truncated fixed32")
            yield number, wire, pos, pos + 4, field_start
            pos += 4
        elif wire == I64:
            if pos + 8 > end:
                raise WireError("truncated fixed64")
            yield number, wire, pos, pos + 8, field_start
            pos += 8
        else:
            raise WireError(
                f"unsupported wire type {wire} for field {number} at offset {field_start}"
            )
    if pos != end:
        raise WireError("message overruns its declared length")


def encode_varint(value: int) -> bytes:
    if value < 0:
        value &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return encode_varint((number << 3) | wire)


def len_field_header(number: int, length: int) -> bytes:
    return tag(number, LEN) + encode_varint(length)
