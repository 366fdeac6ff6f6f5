"""Minimal protobuf wire-format reader/writer for the parts of a caffemodel that can be huge.

Python protobuf parses a message into memory in one piece and refuses messages over 2 GB, so
weights are streamed: this module walks fields over a memoryview (an mmap of the file) and
hands back packed float arrays as zero-copy numpy views. Small sub-messages (a layer's
non-blob fields) are still parsed by protobuf itself.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import WireError

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
MAX_FIELD_NUMBER = 2**29 - 1  # protobuf's limit; larger numbers are corrupt wire data
_MASK64 = (1 << 64) - 1


def read_varint(buf: memoryview, pos: int, end: int | None = None) -> tuple[int, int]:
    """A varint at ``pos`` that must end before ``end``; at most 10 bytes, as protobuf reads."""
    result = shift = 0
    end = len(buf) if end is None else end
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def _read_tag(buf: memoryview, pos: int, end: int) -> tuple[int, int, int]:
    field_start = pos
    key, pos = read_varint(buf, pos, end)
    if key > 0xFFFFFFFF:
        raise WireError(f"tag does not fit 32 bits at offset {field_start}")
    number, wire = key >> 3, key & 7
    if number == 0 or number > MAX_FIELD_NUMBER:
        raise WireError(f"invalid field number {number} at offset {field_start}")
    return number, wire, pos


def _skip_group(buf: memoryview, pos: int, end: int, number: int, depth: int) -> int:
    """Skip an (unknown) group's fields up to its matching end-group tag; returns after it."""
    if depth > 100:  # protobuf's default recursion limit
        raise WireError("groups nested too deeply")
    while pos < end:
        start = pos
        inner, wire, pos = _read_tag(buf, pos, end)
        if wire == EGROUP:
            if inner != number:
                raise WireError(f"end-group tag {inner} does not match group {number}")
            return pos
        pos = _skip_value(buf, pos, end, inner, wire, start, depth)
    raise WireError(f"group {number} is not closed")


def _skip_value(
    buf: memoryview, pos: int, end: int, number: int, wire: int, field_start: int, depth: int
) -> int:
    if wire == VARINT:
        return read_varint(buf, pos, end)[1]
    if wire == LEN:
        length, pos = read_varint(buf, pos, end)
        if length > end - pos:
            raise WireError(
                f"length-delimited field {number} runs past the end "
                f"(offset {field_start}, length {length})"
            )
        return pos + length
    if wire in (I32, I64):
        size = 4 if wire == I32 else 8
        if pos + size > end:
            raise WireError(f"truncated fixed{size * 8} field {number}")
        return pos + size
    if wire == SGROUP:
        return _skip_group(buf, pos, end, number, depth + 1)
    if wire == EGROUP:
        raise WireError(f"end-group tag without a group (field {number}, offset {field_start})")
    raise WireError(f"invalid wire type {wire} for field {number} at offset {field_start}")


def iter_fields(
    buf: memoryview, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, int, int, int, int]]:
    """Yield (field_number, wire_type, value_or_start, value_end, field_start) per field.

    For VARINT the third item is the value; for LEN/I32/I64 it is the payload's start offset
    and the fourth its end. ``field_start`` is where the tag begins (for re-slicing). Groups
    (no caffe.proto field is one) are checked and skipped, as protobuf keeps them as unknown
    fields; whatever protobuf's parser rejects (bad wire types, field numbers, tags, stray
    end-groups, overruns) raises ``WireError``.
    """
    pos = start
    end = len(buf) if end is None else end
    while pos < end:
        field_start = pos
        number, wire, pos = _read_tag(buf, pos, end)
        if wire == VARINT:
            value, pos = read_varint(buf, pos, end)
            yield number, wire, value, pos, field_start
            continue
        after = _skip_value(buf, pos, end, number, wire, field_start, 0)
        if wire == SGROUP:
            pos = after
            continue
        if wire == LEN:
            pos = read_varint(buf, pos, end)[1]
        yield number, wire, pos, after, field_start
        pos = after


def read_packed_varints(buf: memoryview, start: int, end: int) -> list[int]:
    """The values of a packed repeated varint field (e.g. ``BlobShape.dim``)."""
    out, pos = [], start
    while pos < end:
        value, pos = read_varint(buf, pos, end)
        out.append(value)
    return out


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
