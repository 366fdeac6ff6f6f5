"""A fork's own ``caffe.proto``, compiled at run time and merged with ours.

Design (one place): our ``caffe_pb2`` stays the schema every reader, layer and writer uses. A
fork's complete ``caffe.proto`` is compiled by protobuf's own compiler (``grpc_tools.protoc``,
the ``forks`` extra) into a FileDescriptorSet, loaded into a private descriptor pool, and
cached by the file's SHA-256. While a schema is active (``use_schema``; ``torchcaffe.load(...,
caffe_proto=...)`` and the Caffe face set it), text and binary NetParameter / SolverParameter
are parsed with THEIR generated classes (a superset of Caffe's) and then copied into ours by
field name: fields we know land at our numbers (a fork that renumbers a field we carry, e.g.
brocolli's ``ceil_mode`` at PoolingParameter 13, is listed in ``proto.fork_fields`` and lands
at our number, after which ``formats.upgrade`` maps it as for text); fields we do not know are
kept as unknown fields at their fork's numbers, so they survive copies, upgrades and phase
filtering. A layer whose ``param_field`` is not ours reads it through the schema that was
active when it was built: ``CaffeLayer.param`` reparses the layer's bytes with their
``LayerParameter`` and hands back their message.

Before any of that, ``check`` compares every message both schemas define: a field at a number
we use for another name or type, or a name we hold at another number (and not a known
relocation), is a ``SchemaError`` naming both definitions. Integer fields may differ in
width or sign (same wire encoding). Defaults stay ours: the built-in layers of the forks we
carry already apply their fork's defaults (e.g. SegNet's Upsample scale 2 when unset).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from ..errors import PrototxtError, SchemaError
from ..proto import caffe_pb2
from ..proto.fork_fields import RELOCATED_FIELDS

PathLike = str | os.PathLike
OUR_PROTO = "proto/caffe.proto"
EXTRA_HINT = "pip install 'torchcaffe[forks]' (grpcio-tools compiles the fork's caffe.proto)"

_CACHE: dict[str, UserSchema] = {}
_ACTIVE: contextvars.ContextVar[UserSchema | None] = contextvars.ContextVar(
    "torchcaffe_user_schema", default=None
)
# (message full name, field name, fork's number): relocations we map instead of refusing.
_KNOWN_RELOCATIONS = {(r.message, r.field, r.fork_number) for r in RELOCATED_FIELDS}


@dataclass
class UserSchema:
    """A fork's compiled schema: its pool, its package, and its generated message classes."""

    path: str
    sha256: str
    package: str
    pool: descriptor_pool.DescriptorPool
    _classes: dict[str, type[Message]] = field(default_factory=dict)

    def message_class(self, name: str) -> type[Message]:
        """Their generated class for ``name`` ("LayerParameter" or a full name)."""
        full = name if "." in name else f"{self.package}.{name}" if self.package else name
        cls = self._classes.get(full)
        if cls is None:
            cls = message_factory.GetMessageClass(self.pool.FindMessageTypeByName(full))
            self._classes[full] = cls
        return cls

    def has_message(self, name: str) -> bool:
        full = f"{self.package}.{name}" if self.package else name
        try:
            self.pool.FindMessageTypeByName(full)
        except KeyError:
            return False
        return True


# -- compile ----------------------------------------------------------------------------------


def load_schema(caffe_proto: PathLike) -> UserSchema:
    """Compile (or fetch from the cache) a fork's ``caffe.proto``; checks it against ours."""
    path = os.fspath(caffe_proto)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PrototxtError(
            f"cannot read the fork's caffe.proto ({e.strerror})", path=path
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    cached = _CACHE.get(digest)
    if cached is not None:
        return cached
    files = _compile(path)
    pool = descriptor_pool.DescriptorPool()
    for fdp in files.file:
        pool.Add(fdp)
    package = _net_package(files, path)
    schema = UserSchema(path, digest, package, pool)
    check(schema)
    _CACHE[digest] = schema
    return schema


def _compile(path: str) -> descriptor_pb2.FileDescriptorSet:
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        raise SchemaError(
            "reading a fork's caffe.proto needs protobuf's compiler", path=path, hint=EXTRA_HINT
        ) from None
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    directory, name = os.path.split(os.path.abspath(path))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "schema.pb")
        args = ["protoc", f"-I{directory}", f"-I{well_known}", "--include_imports"]
        args += [f"--descriptor_set_out={out}", name]
        with _captured_stderr() as err:
            rc = protoc.main(args)
        if rc != 0:
            raise SchemaError(
                f"protoc cannot compile the fork's caffe.proto: {err[0].strip() or rc}",
                path=path,
            )
        files = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            files.ParseFromString(f.read())
    return files


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """protoc writes its diagnostics to fd 2; the list gets them, for the error message."""
    text: list[str] = [""]
    with tempfile.TemporaryFile(mode="w+") as tmp:
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            yield text
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text[0] = tmp.read()


def _net_package(files: descriptor_pb2.FileDescriptorSet, path: str) -> str:
    for fdp in files.file:
        if any(m.name == "NetParameter" for m in fdp.message_type):
            return fdp.package
    raise SchemaError(
        "the file defines no NetParameter message",
        path=path,
        expected="a complete caffe.proto (a copy of Caffe's with the fork's additions)",
        got="none",
    )


# -- clashes ----------------------------------------------------------------------------------


def _type_name(fd: FieldDescriptor) -> str:
    if fd.message_type is not None:
        return fd.message_type.name
    if fd.enum_type is not None:
        return fd.enum_type.name
    names = {v: k[5:].lower() for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}
    return names.get(fd.type, str(fd.type))


def _describe(fd: FieldDescriptor, file: str) -> str:
    rep = "repeated " if fd.is_repeated else ""
    return f"{fd.containing_type.name}.{fd.name} = {fd.number} ({rep}{_type_name(fd)}, {file})"


# Varint integer types one schema may use where the other uses another (SegNet's uint32
# Upsample ``scale`` against brocolli's int32): same wire encoding, values copy by name.
_INTEGERS = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
    }
)


def _same_type(a: FieldDescriptor, b: FieldDescriptor) -> bool:
    if a.is_repeated != b.is_repeated:
        return False
    if a.type in _INTEGERS and b.type in _INTEGERS:
        return True
    return a.type == b.type and _type_name(a) == _type_name(b)


def check(schema: UserSchema) -> None:
    """Raise ``SchemaError`` for the first field of theirs that clashes with ours."""
    for ours in caffe_pb2.DESCRIPTOR.message_types_by_name.values():
        if not schema.has_message(ours.name):
            continue
        theirs = schema.pool.FindMessageTypeByName(f"{schema.package}.{ours.name}")
        _check_message(theirs, ours, schema.path)


def _check_message(theirs: Descriptor, ours: Descriptor, path: str) -> None:
    for fd in theirs.fields:
        by_name = ours.fields_by_name.get(fd.name)
        by_number = ours.fields_by_number.get(fd.number)
        relocated = (ours.full_name, fd.name, fd.number) in _KNOWN_RELOCATIONS
        clash = None
        if by_name is not None and (by_name.number != fd.number and not relocated):
            clash = by_name
        elif by_name is not None and not _same_type(by_name, fd):
            clash = by_name
        elif by_number is not None and by_number.name != fd.name and not relocated:
            clash = by_number
        if clash is not None:
            raise SchemaError(
                f"the fork's field {_describe(fd, path)} clashes with torchcaffe's "
                f"{_describe(clash, OUR_PROTO)}",
                path=path,
                hint="a fork field must use a name and number Caffe's schema leaves free; "
                "rename or renumber it in the fork's caffe.proto (and re-save binary files)",
            )


# -- active schema and conversion ---------------------------------------------------------------


def active() -> UserSchema | None:
    """The schema readers and layers use now (None: ours alone)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def use_schema(caffe_proto: PathLike | UserSchema | None) -> Iterator[UserSchema | None]:
    """Make a fork's schema active for the readers and the layers built inside the block."""
    if caffe_proto is None:
        yield _ACTIVE.get()
        return
    schema = caffe_proto if isinstance(caffe_proto, UserSchema) else load_schema(caffe_proto)
    token = _ACTIVE.set(schema)
    try:
        yield schema
    finally:
        _ACTIVE.reset(token)


def their_class_for(message_type: type[Message]) -> type[Message] | None:
    """Their class for one of our message types, when a schema is active and defines it."""
    schema = _ACTIVE.get()
    if schema is None or message_type.DESCRIPTOR.file is not caffe_pb2.DESCRIPTOR:
        return None
    name = message_type.DESCRIPTOR.name
    return schema.message_class(name) if schema.has_message(name) else None


def to_ours(theirs: Message, ours: Message, where: str = "") -> None:
    """Copy ``theirs`` into ``ours`` by field name; fields we lack stay unknown fields.

    An enum value only the fork defines is a ``SchemaError`` naming where it is set: no
    built-in layer implements it, and dropping it would run the default silently."""
    known = ours.DESCRIPTOR.fields_by_name
    for fd, value in theirs.ListFields():
        mine = known.get(fd.name)
        here = f"{where}.{fd.name}" if where else fd.name
        if mine is None:
            ours.MergeFromString(_single_field(theirs, fd, value))
        elif fd.message_type is not None:
            if fd.is_repeated:
                target = getattr(ours, fd.name)
                for i, item in enumerate(value):
                    name = (
                        getattr(item, "name", "")
                        if "name" in item.DESCRIPTOR.fields_by_name
                        else ""
                    )
                    to_ours(item, target.add(), f"{here}[{name!r}]" if name else f"{here}[{i}]")
            else:
                to_ours(value, getattr(ours, fd.name), here)
        else:
            if mine.enum_type is not None:
                for v in value if fd.is_repeated else [value]:
                    _check_enum_value(fd, mine, v, here)
            if fd.is_repeated:
                getattr(ours, fd.name).extend(value)
            else:
                setattr(ours, fd.name, value)


def _check_enum_value(fd: FieldDescriptor, mine: FieldDescriptor, value: int, here: str) -> None:
    if value in mine.enum_type.values_by_number:
        return
    their_value = fd.enum_type.values_by_number.get(value) if fd.enum_type else None
    label = f"{their_value.name} ({value})" if their_value is not None else str(value)
    raise SchemaError(
        f"{here} is {label}, a value only the fork's schema defines",
        expected=" | ".join(v.name for v in mine.enum_type.values),
        got=label,
        hint="no built-in layer implements it; register a layer type of your own that does "
        "(docs/forks.md)",
    )


def _single_field(theirs: Message, fd: FieldDescriptor, value: Any) -> bytes:
    part = type(theirs)()
    if fd.is_repeated:
        getattr(part, fd.name).extend(value)
    elif fd.message_type is not None:
        getattr(part, fd.name).CopyFrom(value)
    else:
        setattr(part, fd.name, value)
    return part.SerializeToString()


def fork_param(schema: UserSchema, layer_param: caffe_pb2.LayerParameter, name: str) -> Message:
    """``layer_param``'s field ``name`` as the fork's message (their LayerParameter reading)."""
    cls = schema.message_class("LayerParameter")
    if name not in cls.DESCRIPTOR.fields_by_name:
        raise SchemaError(
            f"the layer's param_field {name!r} is in neither torchcaffe's schema nor the fork's",
            path=schema.path,
            layer=layer_param.name,
            layer_type=layer_param.type,
        )
    return getattr(cls.FromString(layer_param.SerializeToString()), name)
