"""Trained weights in and out: binary ``.caffemodel`` (V0, V1, V2) and HDF5 ``.caffemodel.h5``.

Loading is by layer name, as Caffe's CopyTrainedLayersFrom: layers the net lacks are skipped,
a blob count or shape that does not fit is an error naming the layer, the param index and
both shapes. Binary files are memory-mapped and walked at the wire level, so packed floats
reach the params as zero-copy views (no second copy of the weights, no 2 GB message limit).
Saving streams each layer the same way and is atomic (temp file + rename).
"""

from __future__ import annotations

import mmap
import os
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from google.protobuf.message import DecodeError

from .. import limits
from ..errors import MissingWeightsError, PartialWeightsWarning, WeightsError
from ..proto import caffe_pb2
from . import wire
from .atomic import atomic_write

if TYPE_CHECKING:
    from ..net.net import TorchNet
    from ..net.program import LayerStep

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
# Field numbers the wire-level reader and writer walk, from caffe.proto via caffe_pb2.
_Net, _V2, _V1, _V0 = (
    caffe_pb2.NetParameter,
    caffe_pb2.LayerParameter,
    caffe_pb2.V1LayerParameter,
    caffe_pb2.V0LayerParameter,
)
NET_NAME_FIELD_NUMBER = _Net.NAME_FIELD_NUMBER
NET_LAYER_FIELD_NUMBER = _Net.LAYER_FIELD_NUMBER  # LayerParameter (V2)
NET_LAYERS_FIELD_NUMBER = _Net.LAYERS_FIELD_NUMBER  # V1LayerParameter, possibly holding V0
V2_NAME_FIELD_NUMBER = _V2.NAME_FIELD_NUMBER
V2_TYPE_FIELD_NUMBER = _V2.TYPE_FIELD_NUMBER
V2_BLOBS_FIELD_NUMBER = _V2.BLOBS_FIELD_NUMBER
V1_NAME_FIELD_NUMBER = _V1.NAME_FIELD_NUMBER
V1_TYPE_FIELD_NUMBER = _V1.TYPE_FIELD_NUMBER
V1_BLOBS_FIELD_NUMBER = _V1.BLOBS_FIELD_NUMBER
V1_V0_LAYER_FIELD_NUMBER = _V1.LAYER_FIELD_NUMBER
V0_BLOBS_FIELD_NUMBER = _V0.BLOBS_FIELD_NUMBER  # V0 name and type share V2's numbers
BLOB_LEGACY_FIELD_NUMBERS = (  # num, channels, height, width
    caffe_pb2.BlobProto.NUM_FIELD_NUMBER,
    caffe_pb2.BlobProto.CHANNELS_FIELD_NUMBER,
    caffe_pb2.BlobProto.HEIGHT_FIELD_NUMBER,
    caffe_pb2.BlobProto.WIDTH_FIELD_NUMBER,
)
BLOB_DATA_FIELD_NUMBER = caffe_pb2.BlobProto.DATA_FIELD_NUMBER
BLOB_DIFF_FIELD_NUMBER = caffe_pb2.BlobProto.DIFF_FIELD_NUMBER
BLOB_SHAPE_FIELD_NUMBER = caffe_pb2.BlobProto.SHAPE_FIELD_NUMBER
BLOB_DOUBLE_DATA_FIELD_NUMBER = caffe_pb2.BlobProto.DOUBLE_DATA_FIELD_NUMBER
BLOB_DOUBLE_DIFF_FIELD_NUMBER = caffe_pb2.BlobProto.DOUBLE_DIFF_FIELD_NUMBER
SHAPE_DIM_FIELD_NUMBER = caffe_pb2.BlobShape.DIM_FIELD_NUMBER

RENAME_HINT = (
    "To learn this layer's parameters from scratch rather than copying from a "
    "saved net, rename the layer"
)
MAX_PARAMS = 1024  # param blobs one layer may have, far above any Caffe layer's
LIMITS_HINT = "see docs/limits.md to raise the limit for a file you trust"


@dataclass
class BlobRecord:
    """One param blob as stored: its shape, whether it used legacy num/channels/h/w fields."""

    shape: tuple[int, ...]
    legacy_4d: bool
    data: np.ndarray | LazyDataset  # binary: a flat read-only view into the file
    diff: np.ndarray | None = None


@dataclass
class LayerRecord:
    name: str
    type: str
    blobs: list[BlobRecord | None]  # None: absent from an HDF5 file (allowed for shared params)
    partial: bool = False  # HDF5: fewer blobs than the layer has is allowed, as in Caffe
    links: int | None = None  # HDF5: entries in the layer's group (Caffe checks the count)


class LazyDataset:
    """An HDF5 dataset whose shape and dtype are checked; its values are read only on demand,
    after the shape was matched against the net (a 3 KB file may declare terabytes)."""

    def __init__(self, dataset, where: str, path: str) -> None:
        self.dataset = dataset
        self.where = where
        self.path = path
        self.shape = tuple(int(d) for d in dataset.shape)
        self.size = int(np.prod(self.shape, dtype=object))

    def read(self, dtype: type[np.floating]) -> np.ndarray:
        try:
            return np.asarray(self.dataset[()], dtype=dtype).reshape(-1)
        except (OSError, ValueError, TypeError, RuntimeError) as err:
            raise WeightsError(
                f"cannot read HDF5 dataset {self.where}: {err}", path=self.path
            ) from None


# -- reading ----------------------------------------------------------------------------------
def is_hdf5(path: str | os.PathLike) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == HDF5_SIGNATURE


def read_weights(
    path: str | os.PathLike, names: Collection[str] | None = None
) -> Iterator[LayerRecord]:
    """Layer records of a binary or HDF5 weights file, in file order.

    ``names``: the net's layer names. An HDF5 file's other groups are then not even opened, as
    Caffe's CopyTrainedLayersFromHDF5 ignores them (a binary file is one protobuf message and
    is checked whole, as Caffe's parser does).
    """
    path = check_weights_file(path)
    if is_hdf5(path):
        return read_hdf5_weights(path, names)
    return read_binary_weights(path)


def check_weights_file(path: str | os.PathLike) -> str:
    """``path`` as a string, once it names a file of a size within the limits (before anything
    opens it: a directory or a missing file is a WeightsError, not an OSError)."""
    path = os.fspath(path)
    if os.path.isdir(path):  # still a MissingWeightsError: scripts catch its RuntimeError
        raise MissingWeightsError("is a directory, not a weights file", path=path)
    if not os.path.isfile(path):
        raise MissingWeightsError("weights file not found", path=path)
    problem = limits.file_size_problem(os.path.getsize(path), weights=True)
    if problem:
        raise WeightsError(problem, path=path, hint=LIMITS_HINT)
    return path


def read_binary_weights(path: str | os.PathLike) -> Iterator[LayerRecord]:
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size == 0:
        return iter(())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return _records(memoryview(mm), path)


def _records(buf: memoryview, path: str) -> Iterator[LayerRecord]:
    """Walk NetParameter: layers are streamed; every other field is checked by protobuf."""
    rest: list[tuple[int, int]] = []
    kinds: set[int] = set()
    try:
        for number, wtype, start, end, field_start in wire.iter_fields(buf):
            if number in (NET_LAYER_FIELD_NUMBER, NET_LAYERS_FIELD_NUMBER) and wtype == wire.LEN:
                kinds.add(number)
                if len(kinds) == 2:  # Caffe's UpgradeV1Net refuses such a net
                    raise WeightsError(
                        "the file holds both 'layer' (V2) and 'layers' (V1) records", path=path
                    )
            if number == NET_LAYER_FIELD_NUMBER and wtype == wire.LEN:
                yield _v2_layer(buf, start, end)
            elif number == NET_LAYERS_FIELD_NUMBER and wtype == wire.LEN:
                yield _v1_layer(buf, start, end)
            else:
                rest.append((field_start, end))
        _check_with_protobuf(buf, rest, caffe_pb2.NetParameter)
    except wire.WireError as err:
        raise WeightsError(
            f"not a valid binary caffemodel (NetParameter): {err}", path=path
        ) from None


def _check_with_protobuf(buf: memoryview, spans: list[tuple[int, int]], message) -> None:
    """The fields not streamed here go through protobuf's own parser, which rejects what it
    rejects in a whole-message parse (e.g. a corrupt nested parameter message)."""
    if not spans:
        return
    try:
        message.FromString(b"".join(bytes(buf[s:e]) for s, e in spans))
    except DecodeError as err:
        raise wire.WireError(f"{message.DESCRIPTOR.name}: {err}") from None


def _string(buf: memoryview, start: int, end: int) -> str:
    return bytes(buf[start:end]).decode("utf-8", errors="surrogateescape")


def _named_layer(buf: memoryview, start: int, end: int, blobs_field: int, message) -> LayerRecord:
    """A V2 LayerParameter or a V0 LayerParameter: same name and type fields, blobs differ."""
    name, type_ = "", ""
    blobs: list[BlobRecord | None] = []
    rest: list[tuple[int, int]] = []
    for number, wtype, s, e, fs in wire.iter_fields(buf, start, end):
        if number == V2_NAME_FIELD_NUMBER and wtype == wire.LEN:
            name = _string(buf, s, e)
        elif number == V2_TYPE_FIELD_NUMBER and wtype == wire.LEN:
            type_ = _string(buf, s, e)
        elif number == blobs_field and wtype == wire.LEN:
            blobs.append(_blob(buf, s, e))
        else:
            rest.append((fs, e))
    _check_with_protobuf(buf, rest, message)
    return LayerRecord(name, type_, blobs)


def _v2_layer(buf: memoryview, start: int, end: int) -> LayerRecord:
    return _named_layer(buf, start, end, V2_BLOBS_FIELD_NUMBER, caffe_pb2.LayerParameter)


def _v1_layer(buf: memoryview, start: int, end: int) -> LayerRecord:
    name, type_ = "", ""
    blobs: list[BlobRecord | None] = []
    v0: LayerRecord | None = None
    rest: list[tuple[int, int]] = []
    for number, wtype, s, e, fs in wire.iter_fields(buf, start, end):
        if number == V1_NAME_FIELD_NUMBER and wtype == wire.LEN:
            name = _string(buf, s, e)
        elif number == V1_BLOBS_FIELD_NUMBER and wtype == wire.LEN:
            blobs.append(_blob(buf, s, e))
        elif number == V1_V0_LAYER_FIELD_NUMBER and wtype == wire.LEN:
            v0 = _named_layer(buf, s, e, V0_BLOBS_FIELD_NUMBER, caffe_pb2.V0LayerParameter)
        else:
            if number == V1_TYPE_FIELD_NUMBER and wtype == wire.VARINT:
                type_ = _v1_type_name(s)
            rest.append((fs, e))
    _check_with_protobuf(buf, rest, caffe_pb2.V1LayerParameter)
    if v0 is not None and not name:
        return v0
    return LayerRecord(name, type_, blobs or (v0.blobs if v0 else []))


def _v1_type_name(value: int) -> str:
    try:
        return caffe_pb2.V1LayerParameter.LayerType.Name(value)
    except ValueError:
        return str(value)


def _floats(buf: memoryview, chunks: list, dtype: str) -> np.ndarray | None:
    if not chunks:
        return None
    size = np.dtype(dtype).itemsize
    for s, e in chunks:
        if (e - s) % size:
            raise wire.WireError(
                f"packed {dtype[1:]} field of {e - s} bytes is not a multiple of {size}"
            )
    parts = [np.frombuffer(buf, dtype=dtype, count=(e - s) // size, offset=s) for s, e in chunks]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _int32(value: int) -> int:
    """A varint as protobuf reads it into an int32 field (low 32 bits, signed)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _blob(buf: memoryview, start: int, end: int) -> BlobRecord:
    legacy = {}
    dims: list[int] = []
    data: list = []
    diff: list = []
    ddata: list = []
    ddiff: list = []
    for number, wtype, s, e, _ in wire.iter_fields(buf, start, end):
        if number in BLOB_LEGACY_FIELD_NUMBERS and wtype == wire.VARINT:
            legacy[number] = _int32(s)
        elif number == BLOB_SHAPE_FIELD_NUMBER and wtype == wire.LEN:
            # a repeated occurrence of the shape message merges: its dims append
            for n2, w2, s2, e2, _ in wire.iter_fields(buf, s, e):
                if n2 == SHAPE_DIM_FIELD_NUMBER and w2 == wire.LEN:  # packed dims
                    dims.extend(wire.read_packed_varints(buf, s2, e2))
                elif n2 == SHAPE_DIM_FIELD_NUMBER and w2 == wire.VARINT:
                    dims.append(s2)
        elif number == BLOB_DATA_FIELD_NUMBER and wtype in (wire.LEN, wire.I32):
            data.append((s, e))
        elif number == BLOB_DIFF_FIELD_NUMBER and wtype in (wire.LEN, wire.I32):
            diff.append((s, e))
        elif number == BLOB_DOUBLE_DATA_FIELD_NUMBER and wtype in (wire.LEN, wire.I64):
            ddata.append((s, e))
        elif number == BLOB_DOUBLE_DIFF_FIELD_NUMBER and wtype in (wire.LEN, wire.I64):
            ddiff.append((s, e))
    dims = [d - (1 << 64) if d >= 1 << 63 else d for d in dims]
    if legacy:
        shape = tuple(int(legacy.get(k, 0)) for k in BLOB_LEGACY_FIELD_NUMBERS)
    else:
        shape = tuple(dims)
    values = _floats(buf, ddata, "<f8")
    single = _floats(buf, data, "<f4")
    if values is None or values.size == 0:
        values = single
    if values is None:
        values = np.zeros(0, dtype=np.float32)
    grads = _floats(buf, ddiff, "<f8")
    single_grads = _floats(buf, diff, "<f4")
    if grads is None or grads.size == 0:
        grads = single_grads
    return BlobRecord(shape, bool(legacy), values, grads)


def read_hdf5_weights(
    path: str | os.PathLike, names: Collection[str] | None = None
) -> Iterator[LayerRecord]:
    """Caffe's CopyTrainedLayersFromHDF5 layout: ``/data/<layer>/<i>``, checked entry by entry
    (group or dataset, numeric dtype, at most 32 axes) before any value is read."""
    import h5py

    path = os.fspath(path)
    try:
        f = h5py.File(path, "r")
    except (OSError, ValueError) as err:
        raise WeightsError(f"cannot open HDF5 weights: {err}", path=path) from None

    def records() -> Iterator[LayerRecord]:
        with f:
            data = _h5_get(f, "data", path)
            if data is None:
                raise WeightsError("HDF5 weights file has no 'data' group", path=path)
            if not isinstance(data, h5py.Group):
                raise WeightsError(
                    "HDF5 entry /data is not a group", path=path, expected="a group of layers"
                )
            for name in _h5_keys(data, "/data", path):
                if names is not None and name not in names:
                    continue
                group = _h5_get(data, name, path)
                where = f"/data/{name}"
                if group is None:  # listed, but h5py cannot open it
                    raise WeightsError(
                        f"HDF5 entry {where} is listed but cannot be opened", path=path
                    )
                if not isinstance(group, h5py.Group):
                    raise WeightsError(
                        f"HDF5 entry {where} is not a group",
                        path=path,
                        expected="a group of datasets '0', '1', ...",
                        got=type(group).__name__,
                    )
                keys = _h5_keys(group, where, path)
                # Caffe reads datasets "0".."n-1" for a layer of n params; no layer has
                # MAX_PARAMS, so indices past it are never read (and cost no list slots)
                count = 1 + max((int(k) for k in keys if k.isdigit() and len(k) < 6), default=-1)
                present = set(keys)
                blobs: list[BlobRecord | None] = []
                for i in range(min(count, MAX_PARAMS)):
                    if str(i) not in present:
                        blobs.append(None)
                        continue
                    ds = _h5_get(group, str(i), path)
                    blobs.append(_h5_blob(ds, f"{where}/{i}", path))
                yield LayerRecord(name, "", blobs, partial=True, links=len(keys))

    return records()


def _h5_get(group, key: str, path: str):
    try:
        return group.get(key)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise WeightsError(f"cannot read HDF5 entry {key!r}: {err}", path=path) from None


def _h5_keys(group, where: str, path: str) -> list[str]:
    try:
        return list(group.keys())
    except (OSError, ValueError, RuntimeError) as err:
        raise WeightsError(f"cannot list HDF5 group {where}: {err}", path=path) from None


def _h5_blob(ds, where: str, path: str) -> BlobRecord:
    import h5py

    if ds is None:  # listed, but h5py cannot open it: a damaged or dangling link
        raise WeightsError(f"HDF5 entry {where} is listed but cannot be opened", path=path)
    if not isinstance(ds, h5py.Dataset):
        raise WeightsError(
            f"HDF5 entry {where} is not a dataset",
            path=path,
            expected="a numeric dataset",
            got=type(ds).__name__,
        )
    problem = hdf5_dataset_problem(ds)
    if problem:
        raise WeightsError(f"HDF5 dataset {where}: {problem}", path=path)
    return BlobRecord(tuple(int(d) for d in ds.shape), False, LazyDataset(ds, where, path))


def hdf5_dataset_problem(ds) -> str | None:
    """Caffe's hdf5_load_nd_dataset checks: float or integer class, at most 32 axes."""
    try:
        dtype, shape = ds.dtype, ds.shape
    except (OSError, ValueError, TypeError, RuntimeError) as err:
        return f"unreadable header ({err})"
    if dtype.kind not in "fiu" or dtype.fields is not None or dtype.subdtype is not None:
        return f"unsupported data type {dtype}; expected a float or integer dataset"
    if shape is None:
        return "has no shape (an empty dataspace)"
    problem = limits.shape_problem(tuple(int(d) for d in shape))
    return f"shape {limits.shape_text(shape)}: {problem}" if problem else None


# -- into a net -------------------------------------------------------------------------------
def shape_equals(target: Sequence[int], record: BlobRecord) -> bool:
    """Caffe's Blob::ShapeEquals: legacy 4-D dims compare with the target's LegacyShape(-4..-1)
    (indexed from the end; missing leading axes count as 1), other shapes must be equal."""
    target = tuple(int(d) for d in target)
    if record.legacy_4d:
        return len(target) <= 4 and (1,) * (4 - len(target)) + target == record.shape
    return target == record.shape


def _materialize(blob: BlobRecord, dtype: torch.dtype) -> np.ndarray:
    if isinstance(blob.data, LazyDataset):
        return blob.data.read(np.float64 if dtype == torch.float64 else np.float32)
    return blob.data


def _target_layers(net: TorchNet, hdf5: bool) -> dict[str, LayerStep]:
    """Layer name -> step, as Caffe picks among layers sharing a name: the binary loader
    searches from the front (first wins), the HDF5 loader uses layer_names_index_ (last)."""
    by_name: dict[str, LayerStep] = {}
    for step in net.steps:
        if hdf5 or step.name not in by_name:
            by_name[step.name] = step
    return by_name


@torch.no_grad()
def copy_trained_layers(
    net: TorchNet,
    records: Iterator[LayerRecord],
    path: str | None = None,
    *,
    strict: bool = False,
    set_diff: Callable[[torch.Tensor, np.ndarray], None] | None = None,
) -> list[str]:
    """Copy blobs into ``net`` by layer name; returns the names of the layers filled.

    Every record is checked against the net before any param changes (all or nothing). Param
    layers the file leaves unfilled keep their fillers, as in Caffe, with a
    ``PartialWeightsWarning`` naming them; ``strict=True`` makes that a ``WeightsError``.
    ``set_diff(param, values)`` gets each stored diff (a snapshot_diff file), which Caffe's
    Blob::FromProto copies into the blob's diff; without it diffs are left unread.
    """
    filled: list[str] = []
    plan: list[tuple[torch.Tensor, np.ndarray, np.ndarray | None]] = []
    first_user: dict[int, tuple[str, int]] = {}
    for step in net.steps:
        if net.holds_user_module(step):
            continue
        for j, blob in enumerate(net.module_of(step).param_blobs()):
            first_user.setdefault(id(blob), (step.name, j))
    by_name: dict[str, LayerStep] | None = None
    swapped: list[str] = []  # the file's layers whose place holds a user's module
    for record in records:
        if by_name is None:
            by_name = _target_layers(net, record.partial)
        found = by_name.get(record.name)
        if found is None:
            continue
        if net.holds_user_module(found):
            swapped.append(record.name)
            continue
        plan += _check_record(net, found, record, first_user, path)
        filled.append(record.name)
    written = {id(target) for target, _, _ in plan}
    _report_unfilled(net, written, path, strict)
    if swapped:
        prefix = f"{path}: " if path else ""
        warnings.warn(
            f"{prefix}the file's blobs for {', '.join(repr(n) for n in swapped)} were not "
            "copied: those layers' places in net.layers hold modules put there by the user",
            PartialWeightsWarning,
            stacklevel=4,  # the caller of load_weights, as for the unfilled layers
        )
    _assign_all([(target, values) for target, values, _ in plan])
    if set_diff is not None:
        for target, _, diff in plan:
            if diff is not None and diff.size:
                set_diff(target, np.array(diff))  # a copy: the file's view is read-only
    return filled


def _check_record(
    net: TorchNet,
    step: LayerStep,
    record: LayerRecord,
    first_user: dict[int, tuple[str, int]],
    path: str | None,
) -> list[tuple[torch.Tensor, np.ndarray, np.ndarray | None]]:
    """The (param, values, stored diff) copies one record makes, after Caffe's checks on
    every blob."""
    targets = net.module_of(step).param_blobs()
    where = {"path": path, "layer": record.name, "layer_type": step.type}
    count = len(record.blobs) if record.links is None else record.links
    count_ok = count <= len(targets) if record.partial else count == len(targets)
    if not count_ok:
        raise WeightsError(
            "incompatible number of blobs", expected=len(targets), got=count, **where
        )
    plan = []
    for j, target in enumerate(targets):
        blob = record.blobs[j] if j < len(record.blobs) else None
        if blob is None:
            if first_user[id(target)] != (record.name, j):
                continue  # weight-shared: the owner's dataset fills it
            raise WeightsError(f"param {j} is missing from the weights file", **where)
        if not shape_equals(target.shape, blob):
            raise WeightsError(
                f"cannot copy param {j} weights; shape mismatch",
                expected=f"target param shape {tuple(target.shape)}",
                got=f"source param shape {blob.shape}"
                + (" (legacy num/channels/height/width)" if blob.legacy_4d else ""),
                hint=RENAME_HINT,
                **where,
            )
        if blob.data.size != target.numel():
            raise WeightsError(
                f"param {j} holds {blob.data.size} values for a blob of shape {blob.shape}",
                expected=target.numel(),
                got=blob.data.size,
                **where,
            )
        diff = blob.diff
        if diff is not None and diff.size and diff.size != target.numel():
            raise WeightsError(  # Caffe's Blob::FromProto checks the diff's count too
                f"param {j} holds {diff.size} diff values for a blob of shape {blob.shape}",
                expected=target.numel(),
                got=diff.size,
                **where,
            )
        plan.append((target, _materialize(blob, target.dtype), diff))
    return plan


def _report_unfilled(net: TorchNet, written: set[int], path: str | None, strict: bool) -> None:
    unfilled: list[str] = []
    total = 0
    for step in net.steps:
        if net.holds_user_module(step):
            continue  # a user's module: its own values, no Caffe layer left unfilled
        blobs = net.module_of(step).param_blobs()
        if not blobs:
            continue
        total += 1
        if any(id(b) not in written for b in blobs) and step.name not in unfilled:
            unfilled.append(step.name)
    if not unfilled:
        return
    shown = ", ".join(repr(n) for n in unfilled[:20])
    if len(unfilled) > 20:
        shown += f" and {len(unfilled) - 20} more"
    what = (
        f"{len(unfilled)} of the net's {total} layers with params got no weights from this "
        f"file and keep their initial (filler) values: {shown}"
    )
    if strict:
        raise WeightsError(
            what,
            path=path,
            hint="check that the weights belong to this net; strict=False loads the rest "
            "(as Caffe does, e.g. for fine-tuning)",
        )
    prefix = f"{path}: " if path else ""
    warnings.warn(
        f"{prefix}{what}. Expected when fine-tuning; pass strict=True to make it an error",
        PartialWeightsWarning,
        stacklevel=5,  # the caller of load_weights (torch.no_grad adds a frame)
    )


def _assign_all(plan: list[tuple[torch.Tensor, np.ndarray]]) -> None:
    """One copy per blob, file view -> param, by torch's ``copy_``: it splits a large copy over
    the intra-op threads, and with it the page faults of a fresh blob's memory (numpy's
    assignment runs on one: ResNet-152 load(proto, weights) at 2 threads, A/B in one process on
    a busy machine, 0.37-0.39 -> 0.29-0.33 s). A double_data record is cast on the way."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only file views; only read from
        for target, values in plan:
            target.copy_(torch.from_numpy(values).view(target.shape))


# -- saving -----------------------------------------------------------------------------------
def _split_layer_param(lp: caffe_pb2.LayerParameter) -> tuple[bytes, bytes]:
    """Serialized fields before and after ``blobs``, so blobs land in canonical order."""
    low, high = caffe_pb2.LayerParameter(), caffe_pb2.LayerParameter()
    low.CopyFrom(lp)
    high.CopyFrom(lp)
    for fd, _ in lp.ListFields():
        if fd.number >= V2_BLOBS_FIELD_NUMBER:
            low.ClearField(fd.name)
        if fd.number <= V2_BLOBS_FIELD_NUMBER:
            high.ClearField(fd.name)
    high.DiscardUnknownFields()
    return low.SerializeToString(deterministic=True), high.SerializeToString(deterministic=True)


def _host_bytes(tensor: torch.Tensor, double: bool) -> memoryview:
    t = tensor.detach().to("cpu", torch.float64 if double else torch.float32).contiguous()
    return t.view(-1).numpy().data.cast("B")


def _blob_chunks(tensor: torch.Tensor, diff: torch.Tensor | None, double: bool) -> list:
    """Wire chunks of one BlobProto: data (or double_data), diff (or double_diff), shape."""
    data_field = BLOB_DOUBLE_DATA_FIELD_NUMBER if double else BLOB_DATA_FIELD_NUMBER
    diff_field = BLOB_DOUBLE_DIFF_FIELD_NUMBER if double else BLOB_DIFF_FIELD_NUMBER
    chunks: list = []
    data = _host_bytes(tensor, double)
    chunks += [wire.len_field_header(data_field, len(data)), data]
    if diff is not None:
        d = _host_bytes(diff, double)
        chunks += [wire.len_field_header(diff_field, len(d)), d]
    if tensor.dim():  # Blob::ToProto sets no shape at all for a 0-axis blob
        dims = b"".join(wire.encode_varint(int(s)) for s in tensor.shape)
        shape = wire.len_field_header(SHAPE_DIM_FIELD_NUMBER, len(dims)) + dims
        chunks += [wire.len_field_header(BLOB_SHAPE_FIELD_NUMBER, len(shape)), shape]
        if double:  # canonical field order: shape (7) before double_data (8)
            chunks = chunks[-2:] + chunks[:-2]
    return chunks


def save_caffemodel(net: TorchNet, path: str | os.PathLike, write_diff: bool = False) -> None:
    """Write ``net`` as Caffe's Net::ToProto + WriteProtoToBinaryFile would, atomically."""
    with atomic_write(path, "wb") as f:
        name = net.name.encode()  # Net::ToProto sets it always, an empty name too
        f.write(wire.len_field_header(NET_NAME_FIELD_NUMBER, len(name)) + name)
        for step in net.steps:
            module = net.module_of(step)
            low, high = _split_layer_param(module.saved_param())
            blob_parts = []
            for blob in module.param_blobs():
                double = blob.dtype == torch.float64
                grad = blob.grad if write_diff else None
                if write_diff and grad is None:
                    grad = torch.zeros_like(blob)
                chunks = _blob_chunks(blob, grad, double)
                body_len = sum(len(c) for c in chunks)
                blob_parts.append([wire.len_field_header(V2_BLOBS_FIELD_NUMBER, body_len)] + chunks)
            total = len(low) + len(high) + sum(len(c) for part in blob_parts for c in part)
            f.write(wire.len_field_header(NET_LAYER_FIELD_NUMBER, total))
            f.write(low)
            for part in blob_parts:
                for chunk in part:
                    f.write(chunk)
            f.write(high)


def save_hdf5(net: TorchNet, path: str | os.PathLike, write_diff: bool = False) -> None:
    """Caffe's Net::ToHDF5: data/<layer>/<i> for owned params, diff/<layer>/<i> for all."""
    import h5py

    _check_hdf5_layer_names(net, path)
    owners: set[int] = set()
    with atomic_write(path, "wb") as raw:
        with h5py.File(raw, "w") as f:
            data = f.create_group("data")
            diff = f.create_group("diff") if write_diff else None
            for step in net.steps:
                blobs = net.module_of(step).param_blobs()
                group = data.create_group(step.name)
                dgroup = diff.create_group(step.name) if diff is not None else None
                for i, blob in enumerate(blobs):
                    host = blob.detach().to("cpu").numpy()
                    if id(blob) not in owners:
                        owners.add(id(blob))
                        group.create_dataset(str(i), data=host)
                    if dgroup is not None:
                        grad = blob.grad if blob.grad is not None else torch.zeros_like(blob)
                        dgroup.create_dataset(str(i), data=grad.detach().to("cpu").numpy())


def _check_hdf5_layer_names(net: TorchNet, path: str | os.PathLike) -> None:
    """Each layer is a group /data/<name>, made by H5Gcreate2 in Caffe's ToHDF5, which fails
    (and Caffe aborts) for a name holding '/' (GoogLeNet's 'inception_3a/1x1'), an empty name
    or one used twice. h5py would nest 'a/b' as group b in group a, which no loader reads back
    as layer 'a/b': refuse before anything is written."""
    seen: set[str] = set()
    for step in net.steps:
        name = step.name
        problem = None
        if "/" in name:
            problem = "holds '/'"
        elif name in ("", "."):
            problem = f"is {name!r}"
        elif name in seen:
            problem = "is used by two layers"
        if problem:
            raise WeightsError(
                f"cannot save HDF5 weights: the layer name {problem}, and each layer is an "
                "HDF5 group /data/<layer name>",
                path=os.fspath(path),
                layer=name,
                layer_type=step.type,
                hint="save a binary .caffemodel instead (net.save, snapshot_format: BINARYPROTO)",
            )
        seen.add(name)
