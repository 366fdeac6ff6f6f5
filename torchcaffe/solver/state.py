"""``.solverstate`` files: Caffe's SolverState in binary proto or HDF5, read and written.

Same content in both: ``iter``, ``learned_net`` (the caffemodel written with it),
``current_step`` (the lr policy's step) and the history blobs in Caffe's order. Writes are
atomic, so an interrupted snapshot leaves the previous one intact.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import SolverError, TorchCaffeError
from ..formats.atomic import atomic_write
from ..formats.binaryproto import array_to_blob_proto, blob_proto_shape, blob_proto_to_array
from ..formats.caffemodel import BlobRecord, hdf5_dataset_problem, shape_equals
from ..formats.prototxt import read_binary_proto, write_binary
from ..proto import caffe_pb2

PathLike = str | os.PathLike


@dataclass
class SolverSnapshot:
    iter: int
    current_step: int
    learned_net: str | None = None
    history: list[np.ndarray] = field(default_factory=list)


def is_hdf5_state(path: PathLike) -> bool:
    """Caffe picks the reader by the ``.h5`` suffix."""
    return os.fspath(path).endswith(".h5")


def write_solverstate(path: PathLike, snap: SolverSnapshot) -> None:
    """Binary SolverState (Caffe's SnapshotSolverStateToBinaryProto), atomically."""
    state = caffe_pb2.SolverState(iter=snap.iter, current_step=snap.current_step)
    if snap.learned_net is not None:
        state.learned_net = snap.learned_net
    for blob in snap.history:
        state.history.add().CopyFrom(array_to_blob_proto(np.asarray(blob, np.float32)))
    write_binary(state, path)


def write_solverstate_hdf5(path: PathLike, snap: SolverSnapshot) -> None:
    """HDF5 SolverState (Caffe's SnapshotSolverStateToHDF5 layout), atomically: the ints as
    hdf5_save_int writes them (one-element int32 arrays), the model name as hdf5_save_string
    (a NUL-terminated fixed string; hdf5_load_string reads it into a buffer of the type's size
    and takes it up to the first NUL, so an unterminated one would read past the end)."""
    import h5py

    with atomic_write(path, "w+b") as f, h5py.File(f, "w") as h5:
        h5.create_dataset("iter", data=np.array([snap.iter], np.int32))
        if snap.learned_net is not None:
            _write_c_string(h5, "learned_net", snap.learned_net)
        h5.create_dataset("current_step", data=np.array([snap.current_step], np.int32))
        group = h5.create_group("history")
        for i, blob in enumerate(snap.history):
            group.create_dataset(str(i), data=np.asarray(blob, np.float32))


def _write_c_string(h5, name: str, value: str) -> None:
    """H5LTmake_dataset_string's dataset: scalar, C string type of strlen + 1, NUL-terminated."""
    import h5py

    raw = value.encode("utf-8", errors="surrogateescape") + b"\0"
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(len(raw))
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    dset = h5py.h5d.create(h5.id, name.encode(), tid, h5py.h5s.create(h5py.h5s.SCALAR))
    dset.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array(raw, dtype=f"S{len(raw)}"))


def read_solverstate(
    path: PathLike, expected_shapes: Sequence[Sequence[int]] | None = None
) -> SolverSnapshot:
    """Either format, by suffix as Caffe's Restore; errors name the file.

    ``expected_shapes`` (one per history blob, as the solver holds them) is checked before any
    history value is read: the count, then each shape as Caffe's loaders compare it (binary:
    Blob::ShapeEquals, legacy 4-D dims indexed from the end; HDF5: the exact shape).
    """
    name = os.fspath(path)
    if not os.path.isfile(name):
        raise SolverError("solver state file not found", path=name)
    if is_hdf5_state(name):
        return _read_hdf5(name, expected_shapes)
    try:
        state = read_binary_proto(name, caffe_pb2.SolverState)
    except TorchCaffeError as err:
        raise SolverError(err.what, path=name, hint=err.hint) from None
    _check_history_count(name, len(state.history), expected_shapes)
    history = []
    for i, blob in enumerate(state.history):
        shape = blob_proto_shape(blob)
        if expected_shapes is not None:
            record = BlobRecord(shape, _is_legacy(blob), np.zeros(0))
            if not shape_equals(expected_shapes[i], record):
                raise _history_mismatch(name, i, expected_shapes[i], shape)
        try:
            history.append(blob_proto_to_array(blob, path=name))
        except TorchCaffeError as err:
            raise SolverError(f"history blob {i}: {err.what}", path=name) from None
    return SolverSnapshot(
        state.iter,
        state.current_step,
        state.learned_net if state.HasField("learned_net") else None,
        history,
    )


def _is_legacy(blob: caffe_pb2.BlobProto) -> bool:
    return any(blob.HasField(f) for f in ("num", "channels", "height", "width"))


def _check_history_count(name: str, count: int, expected: Sequence | None) -> None:
    if expected is not None and count != len(expected):
        raise SolverError(
            "incorrect number of history blobs",
            path=name,
            expected=len(expected),
            got=count,
            hint="the state must come from the same solver type on this net",
        )


def _history_mismatch(name: str, i: int, want: Sequence[int], got: Sequence[int]) -> SolverError:
    return SolverError(
        f"history blob {i} does not fit its param; shape mismatch",
        path=name,
        expected=tuple(int(d) for d in want),
        got=tuple(int(d) for d in got),
    )


def _read_hdf5(name: str, expected: Sequence[Sequence[int]] | None) -> SolverSnapshot:
    """Caffe's RestoreSolverStateFromHDF5, with every entry's kind, dtype and shape checked
    before its values are read."""
    import h5py

    try:
        h5 = h5py.File(name, "r")
    except (OSError, ValueError) as err:
        raise SolverError(f"cannot open the HDF5 solver state ({err})", path=name) from None
    try:
        with h5:
            iter_ = _h5_int(h5, "iter", name)
            current_step = _h5_int(h5, "current_step", name)
            learned = _h5_string(h5, "learned_net", name) if "learned_net" in h5 else None
            group = h5.get("history")
            if not isinstance(group, h5py.Group):
                raise SolverError(
                    "HDF5 entry /history is missing or not a group",
                    path=name,
                    expected="a group of datasets '0', '1', ...",
                    got=type(group).__name__,
                )
            keys = list(group.keys())
            _check_history_count(name, len(keys), expected)
            wanted = [str(i) for i in range(len(keys))]
            if sorted(keys) != sorted(wanted):
                raise SolverError(
                    "HDF5 /history datasets must be named 0..n-1",
                    path=name,
                    expected=wanted[:10],
                    got=sorted(keys)[:10],
                )
            history = []
            for i in range(len(keys)):
                where = f"/history/{i}"
                try:
                    ds = group[str(i)]
                except (KeyError, OSError, ValueError, RuntimeError) as err:  # a damaged link
                    raise SolverError(
                        f"HDF5 entry {where} is listed but cannot be opened ({err})", path=name
                    ) from None
                if not isinstance(ds, h5py.Dataset):
                    raise SolverError(f"HDF5 entry {where} is not a dataset", path=name)
                problem = hdf5_dataset_problem(ds)
                if problem:
                    raise SolverError(f"HDF5 dataset {where}: {problem}", path=name)
                if expected is not None and tuple(ds.shape) != tuple(expected[i]):
                    raise _history_mismatch(name, i, expected[i], ds.shape)
                history.append(np.asarray(ds[()], dtype=np.float32))
            return SolverSnapshot(iter_, current_step, learned, history)
    except (OSError, ValueError, TypeError, KeyError, RuntimeError) as err:
        raise SolverError(f"cannot read the HDF5 solver state ({err})", path=name) from None


def _h5_int(h5, key: str, name: str) -> int:
    """Caffe's hdf5_load_int: a one-element numeric dataset."""
    import h5py

    ds = h5.get(key)
    if not isinstance(ds, h5py.Dataset):
        raise SolverError(
            f"HDF5 solver state has no '{key}' dataset",
            path=name,
            expected="a one-element integer dataset",
            got=type(ds).__name__,
        )
    if ds.dtype.kind not in "iuf" or ds.dtype.fields is not None or ds.size != 1:
        raise SolverError(
            f"HDF5 entry /{key} is not a single number",
            path=name,
            expected="a one-element integer dataset",
            got=f"dtype {ds.dtype}, shape {ds.shape}",
        )
    value = np.asarray(ds[()]).reshape(-1)[0]
    if not np.isfinite(value) or not -(2**31) <= value < 2**31:
        raise SolverError(f"HDF5 entry /{key} is out of range", path=name, got=value)
    return int(value)


def _h5_string(h5, key: str, name: str) -> str:
    """Caffe's hdf5_load_string: a string dataset."""
    import h5py

    ds = h5.get(key)
    if not isinstance(ds, h5py.Dataset) or ds.dtype.kind not in "SUO" or ds.size != 1:
        raise SolverError(
            f"HDF5 entry /{key} is not a string",
            path=name,
            expected="a string dataset",
            got=None if ds is None else f"{type(ds).__name__} {getattr(ds, 'dtype', '')}",
        )
    raw = np.asarray(ds[()]).reshape(-1)[0]
    if isinstance(raw, bytes):
        return raw.decode("utf-8", errors="surrogateescape")
    if isinstance(raw, str):
        return raw
    raise SolverError(f"HDF5 entry /{key} is not a string", path=name, got=type(raw).__name__)
