"""Read and write Caffe's text and binary protos (nets, solvers) with protobuf's own parsers.

Readers mirror Caffe's ``ReadProtoFromTextFile`` / ``ReadProtoFromBinaryFile`` and
``ReadNetParamsFrom*FileOrDie`` (read, then ``UpgradeNetAsNeeded``); failures raise
``PrototxtError`` naming the file (and, for text, the line and column). Writers are atomic.
"""

from __future__ import annotations

import difflib
import io
import math
import os
import re
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from google.protobuf import text_format, unknown_fields
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from .. import limits
from ..errors import MissingProtoError, PrototxtError, SchemaError, UsageError
from ..proto import caffe_pb2 as pb
from . import user_schema
from .atomic import atomic_write
from .upgrade import (
    V1_LAYER_TYPES,
    upgrade_net_as_needed,
    upgrade_snapshot_prefix_property,
    upgrade_solver_as_needed,
)

PathLike = str | os.PathLike
M = TypeVar("M", bound=Message)

TEXT_SUFFIXES = frozenset({".prototxt", ".pbtxt", ".txt", ".prototext"})
BINARY_SUFFIXES = frozenset({".caffemodel", ".binaryproto", ".pb", ".protobin", ".solverstate"})
TEXT_NAME = "<prototxt text>"  # names in-memory text in messages (never the text itself)
_LOCATION_PREFIX = re.compile(r"^\d+:\d+ : ")
# strings, comments, braces, a `name: "..."` and the words layer/layers (for _layer_at)
_LAYER_TOKENS = re.compile(
    r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|#.*|[{}]|\bname\s*:\s*"([^"]*)"|\blayers?\b'
)
UNKNOWN_FIELD_HINT = (
    "the field is not in torchcaffe's caffe.proto; if the model comes from a Caffe fork, pass "
    "its caffe.proto: torchcaffe.load(..., caffe_proto='their/caffe.proto'), "
    "caffe.Net(..., caffe_proto=...), or --caffe-proto on the command line (docs/forks.md)"
)


# -- low level: any message -----------------------------------------------------------------


def read_bytes(path: PathLike) -> bytes:
    """The file's bytes; a missing or unreadable file raises ``PrototxtError`` naming it."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            problem = limits.file_size_problem(os.fstat(f.fileno()).st_size)
            if problem:
                raise PrototxtError(
                    problem, path=name, hint="see docs/limits.md to raise it for a file you trust"
                )
            return f.read()
    except FileNotFoundError:
        raise MissingProtoError("file not found", path=name) from None
    except IsADirectoryError:
        raise PrototxtError("is a directory, not a proto file", path=name) from None
    except OSError as e:
        raise PrototxtError(f"cannot read the file ({e.strerror})", path=name) from None


def _decode(data: bytes) -> str:
    # Caffe's parser takes raw bytes; surrogateescape keeps stray non-UTF-8 bytes (legacy
    # comments in another encoding) from failing the whole file.
    return data.decode("utf-8", errors="surrogateescape")


_QUOTED_LINE = re.compile(r"^'(.*)': (.*)$", re.DOTALL)


def _around_column(what: str, column: int, keep: int = 60) -> str:
    """protobuf's ``'<line>': <reason>``, its quoted line cut to ``keep`` characters either
    side of ``column`` (a minified prototxt is one line: its whole text was quoted)."""
    match = _QUOTED_LINE.match(what)
    if match is None or len(match.group(1)) <= 2 * keep:
        return what
    line, reason = match.groups()
    start, end = max(0, column - 1 - keep), column - 1 + keep
    snippet = ("..." if start else "") + line[start:end] + ("..." if end < len(line) else "")
    return f"'{snippet}': {reason}"


def parse_text_proto(text: str | bytes, message_type: type[M], path: PathLike | None = None) -> M:
    """Parse protobuf text format into a new ``message_type``; errors carry line and column."""
    name = TEXT_NAME if path is None else os.fspath(path)
    if isinstance(text, bytes):
        text = _decode(text)
    theirs = user_schema.their_class_for(message_type)
    msg = message_type() if theirs is None else theirs()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as e:
        if "\0" in text:  # protobuf would quote the binary bytes it stopped at
            nul_line = text.count("\n", 0, text.index("\0")) + 1
            raise PrototxtError(
                f"cannot parse as {message_type.DESCRIPTOR.name}: the file holds binary data "
                "(a NUL byte), not protobuf text format",
                path=name,
                line=nul_line,
                hint="a .caffemodel or .solverstate is binary; give the text .prototxt here",
            ) from None
        # protobuf quotes the line it stopped at: escape what would reach a terminal raw
        what = "".join(
            c if c.isprintable() else ascii(c)[1:-1] for c in _LOCATION_PREFIX.sub("", str(e))
        )
        what = _around_column(what, e.GetColumn())
        layer, hint = None, None
        if "has no field named" in what or "has no value named" in what:
            layer = _layer_at(text, e.GetLine())
            if theirs is None:
                hint = UNKNOWN_FIELD_HINT
        hint = _layer_type_hint(what) or hint
        raise PrototxtError(
            f"cannot parse as {message_type.DESCRIPTOR.name}: {what}",
            path=name,
            line=e.GetLine(),
            column=e.GetColumn(),
            layer=layer,
            hint=hint,
        ) from None
    except (UnicodeError, ValueError) as e:
        raise PrototxtError(
            f"cannot parse as {message_type.DESCRIPTOR.name}: {e}", path=name
        ) from None
    except SystemError as e:
        # protobuf's upb looks enum values up as UTF-8: one holding a stray non-UTF-8 byte
        # (kept by surrogateescape) surfaces as a SystemError caused by a UnicodeEncodeError
        if not isinstance(e.__cause__, UnicodeError) and not isinstance(
            e.__context__, UnicodeError
        ):
            raise
        line, column = _first_non_utf8(text)
        raise PrototxtError(
            f"cannot parse as {message_type.DESCRIPTOR.name}: an enum value "
            "holds bytes that are not UTF-8",
            path=name,
            line=line,
            column=column,
        ) from None
    return _as_ours(msg, message_type, path)


_V1_ENUM_OF = {v2.lower(): v1 for v1, v2 in V1_LAYER_TYPES.items() if v2}
_V1_TYPE_VALUE = re.compile(r'"caffe\.V1LayerParameter\.LayerType" has no value named "?(\w+)')
_STRING_EXPECTED = re.compile(r"Expected string but found: '(\w+)'")


def _layer_type_hint(what: str) -> str | None:
    """A hint for the V1/V2 type spellings mixed up: ``layers`` (V1) takes an unquoted enum
    (CONVOLUTION), ``layer`` a quoted string ("Convolution"); protobuf's message says neither."""
    m = _V1_TYPE_VALUE.search(what)
    if m:
        word = m.group(1)
        enum = _V1_ENUM_OF.get(word.lower()) or (
            word.upper() if V1_LAYER_TYPES.get(word.upper()) else None
        )
        if enum:
            return (
                f"a legacy 'layers' block takes an unquoted V1 enum: type: {enum} (or write it "
                f"as a current 'layer' block with type: \"{V1_LAYER_TYPES[enum]}\")"
            )
        close = difflib.get_close_matches(word.upper(), list(_V1_ENUM_OF.values()), n=1)
        return (
            f"did you mean {close[0]}? " if close else ""
        ) + "a legacy 'layers' block takes an unquoted V1 enum type such as CONVOLUTION"
    m = _STRING_EXPECTED.search(what)
    if m and V1_LAYER_TYPES.get(m.group(1)) and re.search(rf"\btype\s*:\s*{m.group(1)}\b", what):
        return (
            f"{m.group(1)} is a V1 enum type for a legacy 'layers' block; in a 'layer' block write "
            f'the quoted string type: "{V1_LAYER_TYPES[m.group(1)]}"'
        )
    return None


def _first_non_utf8(text: str) -> tuple[int | None, int | None]:
    """1-based line and column of the first byte surrogateescape kept, or (None, None)."""
    for lineno, line in enumerate(text.splitlines(), 1):
        for col, ch in enumerate(line, 1):
            if "\udc80" <= ch <= "\udcff":
                return lineno, col
    return None, None


def parse_binary_proto(data: bytes, message_type: type[M], path: PathLike | None = None) -> M:
    """Parse protobuf wire format into a new ``message_type``."""
    name = "<bytes>" if path is None else os.fspath(path)
    theirs = user_schema.their_class_for(message_type)
    msg = message_type() if theirs is None else theirs()
    try:
        msg.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise PrototxtError(
            f"not a valid binary {message_type.DESCRIPTOR.name} ({e})",
            path=name,
            hint="the file may be truncated, or be a text prototxt with a binary extension",
        ) from None
    bad = _non_utf8_string(msg)
    if bad:
        raise PrototxtError(
            f"string field {bad} of {message_type.DESCRIPTOR.name} is not valid UTF-8",
            path=name,
            hint="names and strings must be UTF-8, as they must be in a text prototxt",
        )
    return _as_ours(msg, message_type, path)


def _as_ours(msg: Message, message_type: type[M], path: PathLike | None) -> M:
    """A message parsed with a fork's class, copied into ours (see ``user_schema``)."""
    if isinstance(msg, message_type):
        return msg
    ours = message_type()
    try:
        user_schema.to_ours(msg, ours)
    except SchemaError as err:
        raise err.located(path=os.fspath(path) if path is not None else None) from None
    return ours


def _layer_at(text: str, line: int) -> str | None:
    """The name of the top-level ``layer``/``layers`` block holding ``line`` (1-based), if any.

    Tracks brace depth line by line (quoted strings and ``#`` comments skipped), enough to say
    which layer an unknown field sits in."""
    depth, current = 0, None
    in_layer = False
    token = _LAYER_TOKENS
    last_word = None
    for number, row in enumerate(text.splitlines()[:line], start=1):
        for m in token.finditer(row):
            tok = m.group(0)
            if tok == "{":
                depth += 1
                if depth == 1:
                    in_layer, current = last_word in ("layer", "layers"), None
                last_word = None
            elif tok == "}":
                depth -= 1
            elif tok in ("layer", "layers"):
                last_word = tok
            elif m.group(1) is not None and depth == 1 and in_layer and current is None:
                current = m.group(1)
        if number == line:
            break
    return current if in_layer and depth >= 1 else None


def _non_utf8_string(msg: Message, where: str = "") -> str | None:
    """The first string field holding bytes (protobuf hands back invalid UTF-8 as bytes)."""
    for fd, value in msg.ListFields():
        here = f"{where}.{fd.name}" if where else fd.name
        if fd.type == fd.TYPE_STRING:
            values = value if fd.is_repeated else [value]
            for i, v in enumerate(values):
                if isinstance(v, bytes):
                    return f"{here}[{i}]" if fd.is_repeated else here
        elif fd.type == fd.TYPE_MESSAGE:
            values = value if fd.is_repeated else [value]
            for i, v in enumerate(values):
                bad = _non_utf8_string(v, f"{here}[{i}]" if fd.is_repeated else here)
                if bad:
                    return bad
    return None


def read_text_proto(path: PathLike, message_type: type[M]) -> M:
    """Caffe's ReadProtoFromTextFile, raising instead of returning false."""
    return parse_text_proto(read_bytes(path), message_type, path)


def read_binary_proto(path: PathLike, message_type: type[M]) -> M:
    """Caffe's ReadProtoFromBinaryFile, raising instead of returning false."""
    return parse_binary_proto(read_bytes(path), message_type, path)


class _CaffePrinter(text_format._Printer):  # the public printer has no hook for numbers
    """Python's text printer, spelling numbers as C++ TextFormat does (SimpleFtoa/SimpleDtoa)."""

    def PrintFieldValue(self, field: FieldDescriptor, value: Any) -> None:  # noqa: N802
        if field.cpp_type == FieldDescriptor.CPPTYPE_FLOAT:
            self.out.write(_cpp_number(value, 6, 9, float32=True))
        elif field.cpp_type == FieldDescriptor.CPPTYPE_DOUBLE:
            self.out.write(_cpp_number(value, 15, 17, float32=False))
        else:
            super().PrintFieldValue(field, value)


def _cpp_number(value: float, digits: int, fallback: int, *, float32: bool) -> str:
    """protobuf's FloatToBuffer/DoubleToBuffer: ``%.{FLT,DBL}_DIG g`` when that reads back as
    the same value, else 9 (float) / 17 (double) digits. Python's own printer writes the
    shortest round trip instead (``1000000.0`` where C++ writes ``1e+06``, ``104.00699`` for
    C++'s ``104.006989``)."""
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if math.isnan(value):
        return "nan"
    text = f"{value:.{digits}g}"
    back = float(text)
    if float32:  # a 6-digit decimal is never close enough to a tie for double rounding
        back = float(np.float32(back))
    return text if back == value else f"{value:.{fallback}g}"


def caffe_text(msg: Message) -> str:
    """``msg`` in text format as Caffe's C++ TextFormat prints it: numbers as ``SimpleFtoa``
    spells them (``1``, ``1e+06``, ``0.123456702``) and strings with every byte outside
    printable ASCII escaped in octal (C++'s default; Python's printer keeps UTF-8)."""
    out = io.StringIO()
    _CaffePrinter(out=out, as_utf8=False).PrintMessage(msg)
    return out.getvalue()


def write_text(msg: Message, path: PathLike) -> None:
    """Caffe's WriteProtoToTextFile, atomically."""
    text = caffe_text(msg)
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_binary(msg: Message, path: PathLike) -> None:
    """Caffe's WriteProtoToBinaryFile, atomically."""
    data = msg.SerializeToString()
    with atomic_write(path, "wb") as f:
        f.write(data)


# -- nets -------------------------------------------------------------------------------------


def parse_net_text(text: str | bytes, path: PathLike | None = None) -> pb.NetParameter:
    """A ``NetParameter`` from prototxt text, as written (not upgraded)."""
    return parse_text_proto(text, pb.NetParameter, path)


def read_net_text(path: PathLike) -> pb.NetParameter:
    """A text prototxt file as written (not upgraded)."""
    return read_text_proto(path, pb.NetParameter)


def read_net_binary(path: PathLike) -> pb.NetParameter:
    """A binary NetParameter (e.g. a caffemodel) as written (not upgraded)."""
    return read_binary_proto(path, pb.NetParameter)


def read_net(source: PathLike, *, upgrade: bool = True) -> pb.NetParameter:
    """Caffe's ReadNetParamsFrom{Text,Binary}FileOrDie: read, then upgrade as needed.

    ``source`` is a path to a text or binary net, or prototxt text itself (a ``str`` that is
    not an existing file and holds a newline or ``{``, or a ``:`` without a proto file
    extension). Text versus binary goes by the file extension; for other names, text is
    tried first when the bytes are UTF-8.
    """
    path, text = _resolve(source)
    if text is not None:
        net = parse_net_text(text)
    else:
        assert path is not None  # _resolve gives a path or text
        net = _parse_net_auto(read_bytes(path), path)
    return upgrade_net_as_needed(net, path) if upgrade else net


def source_name(source: PathLike) -> str:
    """What messages call ``source``: its path, or ``<prototxt text>`` for inline text."""
    path, _ = _resolve(source)
    return TEXT_NAME if path is None else path


def _resolve(source: PathLike) -> tuple[str | None, str | None]:
    if isinstance(source, os.PathLike):
        return os.fspath(source), None
    if not isinstance(source, str):
        raise UsageError(
            "read_net takes a path or prototxt text",
            expected="str or os.PathLike",
            got=type(source).__name__,
        )
    if os.path.exists(source):
        return source, None
    if "\n" in source or "{" in source:
        return None, source
    if Path(source).suffix.lower() in TEXT_SUFFIXES | BINARY_SUFFIXES or ":" not in source:
        return source, None
    return None, source


def _parse_net_auto(data: bytes, path: str) -> pb.NetParameter:
    return parse_net_auto(data, path)[0]


def parse_net_auto(data: bytes, path: str) -> tuple[pb.NetParameter, bool]:
    """A net file's ``NetParameter`` and whether it was binary: by the file extension, else text
    when the bytes are UTF-8, else binary. A text parse error stands unless the bytes read
    cleanly as binary (so a typo in a text file is reported at its line, not as bad wire data).
    """
    suffix = Path(path).suffix.lower()
    if suffix in BINARY_SUFFIXES:
        return parse_binary_proto(data, pb.NetParameter, path), True
    if suffix in TEXT_SUFFIXES:
        return parse_text_proto(data, pb.NetParameter, path), False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return parse_binary_proto(data, pb.NetParameter, path), True
    try:
        return parse_text_proto(text, pb.NetParameter, path), False
    except PrototxtError as text_error:
        # Small binaries can be valid UTF-8. Take the binary reading only when it is clean
        # (nothing unknown at top level); otherwise the text error is the useful one.
        try:
            net = parse_binary_proto(data, pb.NetParameter, path)
        except PrototxtError:
            raise text_error from None
        if len(unknown_fields.UnknownFieldSet(net)):
            raise text_error from None
        return net, True


# -- solvers ----------------------------------------------------------------------------------


def read_solver(path: PathLike, *, upgrade: bool = True) -> pb.SolverParameter:
    """Caffe's ReadSolverParamsFromTextFileOrDie: solver_type upgrade and snapshot_prefix."""
    solver = read_text_proto(path, pb.SolverParameter)
    if not upgrade:
        return solver
    solver = upgrade_solver_as_needed(solver, path)
    return upgrade_snapshot_prefix_property(solver, path)
