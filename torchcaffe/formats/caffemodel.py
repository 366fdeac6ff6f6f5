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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import WeightsError
from ..proto import caffe_pb2
from . import wire
from .atomic import atomic_write

if TYPE_CHECKING:
    from ..net.net import TorchNet

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


@dataclass
class BlobRecord:
    """One param blob as stored: its shape, whether it used legacy num/channels/h/w fields."""

    shape: tuple[int, ...]
    legacy_4d: bool
    data: np.ndarray  # flat; a read-only view into the file where possible
    diff: np.ndarray | None = None


@dataclass
class LayerRecord:
    name: str
    type: str
    blobs: list[BlobRecord | None]  # None: absent from an HDF5 file (allowed for shared params)
    partial: bool = False  # HDF5: fewer blobs than the layer has is allowed, as in Caffe


# -- reading ----------------------------------------------------------------------------------
def is_hdf5(path: str | os.PathLike) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == HDF5_SIGNATURE


def read_weights(path: str | os.PathLike) -> Iterator[LayerRecord]:
    """Layer records of a binary or HDF5 weights file, in file order."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise WeightsError("weights file not found", path=path)
    if is_hdf5(path):
        return read_hdf5_weights(path)
    return read_binary_weights(path)


def read_binary_weights(path: str | os.PathLike) -> Iterator[LayerRecord]:
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size == 0:
        return iter(())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return _records(memoryview(mm), path)


def _records(buf: memoryview, path: str) -> Iterator[LayerRecord]:
    try:
        for number, wtype, start, end, _ in wire.iter_fields(buf):
            if wtype != wire.LEN:
                continue
            if number == NET_LAYER_FIELD_NUMBER:
                yield _v2_layer(buf, start, end)
            elif number == NET_LAYERS_FIELD_NUMBER:
                yield _v1_layer(buf, start, end)
    except wire.WireError as err:
        raise WeightsError(
            f"not a valid binary caffemodel (NetParameter): {err}", path=path
        ) from None


def _string(buf: memoryview, start: int, end: int) -> str:
    return bytes(buf[start:end]).decode("utf-8", errors="replace")


def _named_layer(buf: memoryview, start: int, end: int, blobs_field: int) -> LayerRecord:
    """A V2 LayerParameter or a V0 LayerParameter: same name and type fields, blobs differ."""
    name, type_ = "", ""
    blobs: list[BlobRecord | None] = []
    for number, wtype, s, e, _ in wire.iter_fields(buf, start, end):
        if number == V2_NAME_FIELD_NUMBER and wtype == wire.LEN:
            name = _string(buf, s, e)
        elif number == V2_TYPE_FIELD_NUMBER and wtype == wire.LEN:
            type_ = _string(buf, s, e)
        elif number == blobs_field and wtype == wire.LEN:
            blobs.append(_blob(buf, s, e))
    return LayerRecord(name, type_, blobs)


def _v2_layer(buf: memoryview, start: int, end: int) -> LayerRecord:
    return _named_layer(buf, start, end, blobs_field=V2_BLOBS_FIELD_NUMBER)


def _v1_layer(buf: memoryview, start: int, end: int) -> LayerRecord:
    name, type_ = "", ""
    blobs: list[BlobRecord | None] = []
    v0: LayerRecord | None = None
    for number, wtype, s, e, _ in wire.iter_fields(buf, start, end):
        if number == V1_NAME_FIELD_NUMBER and wtype == wire.LEN:
            name = _string(buf, s, e)
        elif number == V1_TYPE_FIELD_NUMBER and wtype == wire.VARINT:
            type_ = _v1_type_name(s)
        elif number == V1_BLOBS_FIELD_NUMBER and wtype == wire.LEN:
            blobs.append(_blob(buf, s, e))
        elif number == V1_V0_LAYER_FIELD_NUMBER and wtype == wire.LEN:
            v0 = _v0_layer(buf, s, e)
    if v0 is not None and not name:
        return v0
    return LayerRecord(name, type_, blobs or (v0.blobs if v0 else []))


def _v0_layer(buf: memoryview, start: int, end: int) -> LayerRecord:
    return _named_layer(buf, start, end, blobs_field=V0_BLOBS_FIELD_NUMBER)


def _v1_type_name(value: int) -> str:
    try:
        return caffe_pb2.V1LayerParameter.LayerType.Name(value)
    except ValueError:
        return str(value)


def _floats(buf: memoryview, chunks: list, dtype: str) -> np.ndarray | None:
    if not chunks:
        return None
    parts = [
        np.frombuffer(buf, dtype=dtype, count=(e - s) // np.dtype(dtype).itemsize, offset=s)
        for s, e in chunks
    ]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _blob(buf: memoryview, start: int, end: int) -> BlobRecord:
    legacy = {}
    dims: list[int] = []
    data: list = []
    diff: list = []
    ddata: list = []
    ddiff: list = []
    for number, wtype, s, e, _ in wire.iter_fields(buf, start, end):
        if number in BLOB_LEGACY_FIELD_NUMBERS and wtype == wire.VARINT:
            legacy[number] = s
        elif number == BLOB_SHAPE_FIELD_NUMBER and wtype == wire.LEN:
            for n2, w2, s2, e2, _ in wire.iter_fields(buf, s, e):
                if n2 == SHAPE_DIM_FIELD_NUMBER and w2 == wire.LEN:  # packed dims
                    pos = s2
                    while pos < e2:
                        v, pos = wire.read_varint(buf, pos)
                        dims.append(v)
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
    if values is None:
        values = _floats(buf, data, "<f4")
    if values is None:
        values = np.zeros(0, dtype=np.float32)
    grads = _floats(buf, ddiff, "<f8")
    if grads is None:
        grads = _floats(buf, diff, "<f4")
    return BlobRecord(shape, bool(legacy), values, grads)


def read_hdf5_weights(path: str | os.PathLike) -> Iterator[LayerRecord]:
    import h5py

    path = os.fspath(path)
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise WeightsError(f"cannot open HDF5 weights: {err}", path=path) from None

    def records() -> Iterator[LayerRecord]:
        with f:
            if "data" not in f:
                raise WeightsError("HDF5 weights file has no 'data' group", path=path)
            for name, group in f["data"].items():
                count = 1 + max((int(k) for k in group if k.isdigit()), default=-1)
                blobs = [
                    BlobRecord(
                        tuple(group[str(i)].shape),
                        False,
                        np.asarray(group[str(i)], dtype=np.float32).reshape(-1),
                    )
                    if str(i) in group
                    else None
                    for i in range(count)
                ]
                yield LayerRecord(name, "", blobs, partial=True)

    return records()


# -- into a net -------------------------------------------------------------------------------
def _fits(target: Sequence[int], record: BlobRecord) -> bool:
    target = tuple(target)
    if record.legacy_4d:
        if len(target) <= 4 and (1,) * (4 - len(target)) + target == record.shape:
            return True  # Caffe's ShapeEquals against LegacyShape
        return int(np.prod(target)) == int(np.prod(record.shape))
    return target == record.shape


@torch.no_grad()
def copy_trained_layers(
    net: TorchNet, records: Iterator[LayerRecord], path: str | None = None
) -> list[str]:
    """Copy blobs into ``net`` by layer name; returns the names of the layers filled."""
    filled = []
    names = set(net.layer_names)
    first_user: dict[int, tuple[str, int]] = {}
    for step in net.steps:
        for j, tensor in enumerate(net.module_of(step).param_blobs()):
            first_user.setdefault(id(tensor), (step.name, j))
    for record in records:
        if record.name not in names:
            continue
        step = net.step(record.name)
        targets = net.module_of(step).param_blobs()
        count_ok = (
            len(record.blobs) <= len(targets)
            if record.partial
            else len(record.blobs) == len(targets)
        )
        if not count_ok:
            raise WeightsError(
                "incompatible number of blobs",
                path=path,
                layer=record.name,
                layer_type=step.type,
                expected=len(targets),
                got=len(record.blobs),
            )
        for j, target in enumerate(targets):
            blob = record.blobs[j] if j < len(record.blobs) else None
            if blob is None:
                if first_user[id(target)] != (record.name, j):
                    continue  # weight-shared: the owner's dataset fills it
                raise WeightsError(
                    f"param {j} is missing from the weights file",
                    path=path,
                    layer=record.name,
                    layer_type=step.type,
                )
            if not _fits(target.shape, blob):
                raise WeightsError(
                    f"cannot copy param {j} weights; shape mismatch",
                    path=path,
                    layer=record.name,
                    layer_type=step.type,
                    expected=f"target param shape {tuple(target.shape)}",
                    got=f"source param shape {blob.shape}",
                    hint=RENAME_HINT,
                )
            if blob.data.size != target.numel():
                raise WeightsError(
                    f"param {j} holds {blob.data.size} values for a blob of shape {blob.shape}",
                    path=path,
                    layer=record.name,
                    layer_type=step.type,
                    expected=target.numel(),
                    got=blob.data.size,
                )
            _assign(target, blob.data)
        filled.append(record.name)
    return filled


def _assign(target: torch.Tensor, values: np.ndarray) -> None:
    if target.device.type == "cpu" and target.is_contiguous():
        target.detach().view(-1).numpy()[:] = values  # one copy: file view -> param
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only view; only read from
        source = torch.from_numpy(values)
    target.copy_(source.view(target.shape).to(target.dtype))


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
    dims = b"".join(wire.encode_varint(int(s)) for s in tensor.shape)
    shape = wire.len_field_header(SHAPE_DIM_FIELD_NUMBER, len(dims)) + dims if tensor.dim() else b""
    chunks += [wire.len_field_header(BLOB_SHAPE_FIELD_NUMBER, len(shape)), shape]
    if double:  # canonical field order: shape (7) before double_data (8)
        chunks = chunks[-2:] + chunks[:-2]
    return chunks


def save_caffemodel(net: TorchNet, path: str | os.PathLike, write_diff: bool = False) -> None:
    """Write ``net`` as Caffe's Net::ToProto + WriteProtoToBinaryFile would, atomically."""
    with atomic_write(path, "wb") as f:
        if net.name:
            name = net.name.encode()
            f.write(wire.len_field_header(NET_NAME_FIELD_NUMBER, len(name)) + name)
        for step in net.steps:
            module = net.module_of(step)
            low, high = _split_layer_param(module.layer_param)
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
