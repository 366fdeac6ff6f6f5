"""Reference readings of the same bytes by protobuf's own parser, with Caffe's rules applied
on top (which layer a record fills, Blob::ShapeEquals, value counts). A fuzzed load that
succeeds must equal these; one that the reference accepts must not be refused."""

from __future__ import annotations

import math

import numpy as np
from google.protobuf.message import DecodeError

from torchcaffe.proto import caffe_pb2

LEGACY = ("num", "channels", "height", "width")


class Reject(Exception):
    """The reference refuses the bytes."""


def parse(message_type, data: bytes):
    try:
        return message_type.FromString(data)
    except DecodeError as err:
        raise Reject(str(err)) from None


def is_legacy(blob: caffe_pb2.BlobProto) -> bool:
    return any(blob.HasField(f) for f in LEGACY)


def stored_shape(blob: caffe_pb2.BlobProto) -> tuple[int, ...]:
    if is_legacy(blob):
        return (blob.num, blob.channels, blob.height, blob.width)
    return tuple(blob.shape.dim)


def shape_equals(target: tuple[int, ...], blob: caffe_pb2.BlobProto) -> bool:
    if is_legacy(blob):
        return len(target) <= 4 and (1,) * (4 - len(target)) + tuple(target) == stored_shape(blob)
    return tuple(target) == tuple(blob.shape.dim)


def blob_values(blob: caffe_pb2.BlobProto, count: int) -> np.ndarray:
    """Caffe's FromProto: double_data when non-empty, else data; the count must match, and
    that of a stored diff (double_diff when non-empty) too."""
    if len(blob.double_data):
        values = np.asarray(blob.double_data, np.float64)
    else:
        values = np.asarray(blob.data, np.float32)
    if values.size != count:
        raise Reject(f"{values.size} values for {count}")
    diff = blob.double_diff if len(blob.double_diff) else blob.diff  # checked the same way
    if len(diff) and len(diff) != count:
        raise Reject(f"{len(diff)} diff values for {count}")
    return values


def layer_records(net: caffe_pb2.NetParameter) -> list[tuple[str, list]]:
    """(name, blobs) per record, as the streaming reader names V2, V1 and V0 layers."""
    if len(net.layer) and len(net.layers):
        raise Reject("both layer and layers")
    out = [(lp.name, list(lp.blobs)) for lp in net.layer]
    for v1 in net.layers:
        if v1.HasField("layer") and not v1.name:
            out.append((v1.layer.name, list(v1.layer.blobs)))
        else:
            out.append((v1.name, list(v1.blobs) or list(v1.layer.blobs)))
    return out


def caffemodel_params(data: bytes, targets: dict[str, list[tuple[int, ...]]]) -> dict:
    """Caffe's CopyTrainedLayersFrom(NetParameter): {(layer, j): values} or Reject."""
    net = parse(caffe_pb2.NetParameter, data)
    copies = {}
    for name, blobs in layer_records(net):
        if isinstance(name, bytes) or name not in targets:
            continue
        shapes = targets[name]
        if len(blobs) != len(shapes):
            raise Reject(f"layer {name}: {len(blobs)} blobs for {len(shapes)}")
        for j, (blob, shape) in enumerate(zip(blobs, shapes)):
            if not shape_equals(shape, blob):
                raise Reject(f"layer {name} param {j}: shape")
            copies[(name, j)] = blob_values(blob, math.prod(shape))
    return copies


def solverstate(data: bytes, shapes: list[tuple[int, ...]]):
    """SGD's RestoreSolverStateFromBinaryProto, with ShapeEquals on the history."""
    state = parse(caffe_pb2.SolverState, data)
    if len(state.history) != len(shapes):
        raise Reject("history count")
    history = []
    for blob, shape in zip(state.history, shapes):
        if not shape_equals(shape, blob):
            raise Reject("history shape")
        history.append(blob_values(blob, math.prod(shape)))
    learned = state.learned_net if state.HasField("learned_net") else None
    if isinstance(learned, bytes):  # torchcaffe's rule for every binary proto, as for text
        raise Reject("learned_net is not UTF-8")
    return state.iter, state.current_step, learned, history


def blob_proto_array(data: bytes) -> np.ndarray:
    """Blob::FromProto(reshape) of a BlobProto file, with Caffe's Reshape limits."""
    blob = parse(caffe_pb2.BlobProto, data)
    shape = stored_shape(blob)
    if len(shape) > 32 or any(d < 0 for d in shape) or math.prod(shape) > 2**31 - 1:
        raise Reject("shape")
    return blob_values(blob, math.prod(shape)).reshape(shape)


def datum_array(data: bytes) -> np.ndarray:
    datum = parse(caffe_pb2.Datum, data)
    if datum.encoded:
        raise Reject("encoded")
    shape = (datum.channels, datum.height, datum.width)
    if datum.channels <= 0 or min(shape) < 0 or math.prod(shape) > 2**31 - 1:
        raise Reject("shape")
    count = math.prod(shape)
    if datum.data:
        if len(datum.data) != count:
            raise Reject("data size")
        return np.frombuffer(datum.data, np.uint8).reshape(shape)
    if len(datum.float_data) != count:
        raise Reject("float_data size")
    return np.asarray(datum.float_data, np.float32).reshape(shape)
