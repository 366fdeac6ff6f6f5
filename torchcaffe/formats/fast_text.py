"""A fast path for protobuf text format: the plain subset Caffe prototxts are written in.

protobuf's ``text_format`` is pure Python under every backend (upb has no text parser) and
spends most of its time in a general tokenizer: ResNet-152's deploy prototxt (721 layers)
took 40 ms of CPU, a quarter of a build. This parser tokenizes the whole text with one regex
and fills the message in a flat loop. It accepts only what it can read exactly as
``text_format.Parse`` would: field names, ``:``, ``{ }``, ``,``/``;`` separators, ``#``
comments, decimal integers, plain floats, bools, enum names and strings without escapes. On
anything else (``<>``, ``[...]`` lists or extensions, escapes, octal or hex, ``inf``, a
repeated singular field, an error of any kind) it returns False and the caller parses with
``text_format``, whose result and error messages stay the truth.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

# text_format's tokens (identifier, number, quoted string), in its order; a string here has no
# escapes or newline. ``#`` comments and any other single non-space character come out as
# tokens too; whitespace between tokens is skipped, as text_format skips it.
_TOKEN = re.compile(
    r"#[^\n]*"
    r"|[a-zA-Z_][0-9a-zA-Z_+-]*"
    r"|(?:[0-9+-]|\.[0-9])[0-9a-zA-Z_.+-]*"
    r"|\"[^\"\n\\]*\"|'[^'\n\\]*'"
    r"|\S"
)
_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")  # text_format reads 010 as octal: not here
_FLOAT = re.compile(r"-?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_BOOLS = {"true": True, "t": True, "1": True, "True": True}
_BOOLS.update({"false": False, "f": False, "0": False, "False": False})
_QUOTES = ('"', "'")

_F = FieldDescriptor
_INT_RANGES = {
    **dict.fromkeys((_F.TYPE_INT32, _F.TYPE_SINT32, _F.TYPE_SFIXED32), (-(2**31), 2**31 - 1)),
    **dict.fromkeys((_F.TYPE_INT64, _F.TYPE_SINT64, _F.TYPE_SFIXED64), (-(2**63), 2**63 - 1)),
    **dict.fromkeys((_F.TYPE_UINT32, _F.TYPE_FIXED32), (0, 2**32 - 1)),
    **dict.fromkeys((_F.TYPE_UINT64, _F.TYPE_FIXED64), (0, 2**64 - 1)),
}

Convert = Callable[[str], Any]  # token -> value, or None when only text_format may read it
# per field: (name, is_message, is_repeated, convert); None for a field the fast path leaves
FieldPlan = tuple[str, bool, bool, Convert | None]
_PLANS: dict[Descriptor, dict[str, FieldPlan | None]] = {}


class _Fallback(Exception):
    """Leave this text to text_format."""


def parse_fast(text: str, message: Message) -> bool:
    """Fill the empty ``message`` from ``text``; False (message half-filled) leaves it to
    ``text_format``, and the caller must parse into a fresh message."""
    try:
        _parse([t for t in _TOKEN.findall(text) if t[0] != "#"], message)
    except (_Fallback, ValueError, TypeError, AttributeError):
        return False
    return True


def _parse(tokens: list[str], message: Message) -> None:
    stack: list[Message] = []
    msg, plans = message, _plans(message.DESCRIPTOR)
    i, n = 0, len(tokens)
    while i < n:
        tok = tokens[i]
        i += 1
        if tok == "}":
            if not stack:
                raise _Fallback
            msg = stack.pop()
            plans = _plans(msg.DESCRIPTOR)
        else:
            plan = plans.get(tok)
            if plan is None:
                raise _Fallback
            name, is_message, repeated, convert = plan
            if is_message:
                if i < n and tokens[i] == ":":
                    i += 1
                if i >= n or tokens[i] != "{":
                    raise _Fallback
                i += 1
                if repeated:
                    sub = getattr(msg, name).add()
                elif msg.HasField(name):
                    raise _Fallback  # text_format: "should not have multiple" fields
                else:
                    sub = getattr(msg, name)
                    sub.SetInParent()
                stack.append(msg)
                msg, plans = sub, _plans(sub.DESCRIPTOR)
                continue
            if i >= n or tokens[i] != ":":
                raise _Fallback
            if i + 1 >= n or convert is None:
                raise _Fallback
            value = convert(tokens[i + 1])
            i += 2
            if value is None or (i < n and tokens[i][0] in _QUOTES):
                raise _Fallback  # adjacent strings concatenate: text_format's to do
            if repeated:
                getattr(msg, name).append(value)
            elif msg.HasField(name):
                raise _Fallback
            else:
                setattr(msg, name, value)
        if i < n and tokens[i] in (",", ";"):  # one optional separator after a field
            i += 1
    if stack:
        raise _Fallback  # an unclosed "{"


def _plans(desc: Descriptor) -> dict[str, FieldPlan | None]:
    plans = _PLANS.get(desc)
    if plans is None:
        plans = {f.name: _plan(f) for f in desc.fields}
        _PLANS[desc] = plans
    return plans


def _plan(field: FieldDescriptor) -> FieldPlan | None:
    if field.containing_oneof is not None or field.type == _F.TYPE_GROUP:
        return None  # oneof exclusivity and group names: text_format's rules
    repeated = field.is_repeated
    if field.type == _F.TYPE_MESSAGE:
        if field.message_type.GetOptions().map_entry:
            return None
        return field.name, True, repeated, None
    return field.name, False, repeated, _converter(field)


def _converter(field: FieldDescriptor) -> Convert | None:
    kind = field.type
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        return lambda tok: _integer(tok, low, high)  # unsigned: low 0 rejects "-0" below
    if kind in (_F.TYPE_FLOAT, _F.TYPE_DOUBLE):
        return _float
    if kind == _F.TYPE_BOOL:
        return _BOOLS.get
    if kind == _F.TYPE_STRING:
        return _string
    if kind == _F.TYPE_ENUM:
        by_name = {v.name: v.number for v in field.enum_type.values}
        return by_name.get
    return None  # bytes: escapes matter; text_format reads them


def _integer(tok: str, low: int, high: int) -> int | None:
    if not _DECIMAL.match(tok) or (low == 0 and tok[0] == "-"):
        return None
    value = int(tok)
    return value if low <= value <= high else None


def _float(tok: str) -> float | None:
    return float(tok) if _FLOAT.match(tok) else None


def _string(tok: str) -> str | None:
    if tok[0] not in _QUOTES or len(tok) < 2 or tok[-1] != tok[0]:
        return None
    value = tok[1:-1]
    if not value.isascii():
        value.encode("utf-8")  # a surrogate (a non-UTF-8 byte) raises: text_format reports it
    return value
