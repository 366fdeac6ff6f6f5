"""``.solverstate`` files: Caffe's SolverState in binary proto or HDF5, read and written.

Same content in both: ``iter``, ``learned_net`` (the caffemodel written with it),
``current_step`` (the lr policy's step) and the history blobs in Caffe's order. Writes are
atomic, so an interrupted snapshot leaves the previous one intact.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import SolverError
from ..formats.atomic import atomic_write
from ..formats.binaryproto import array_to_blob_proto, blob_proto_to_array
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
    """HDF5 SolverState (Caffe's SnapshotSolverStateToHDF5 layout), atomically."""
    import h5py

    with atomic_write(path, "w+b") as f, h5py.File(f, "w") as h5:
        h5.create_dataset("iter", data=np.int32(snap.iter))
        if snap.learned_net is not None:
            h5.create_dataset("learned_net", data=np.bytes_(snap.learned_net))
        h5.create_dataset("current_step", data=np.int32(snap.current_step))
        group = h5.create_group("history")
        for i, blob in enumerate(snap.history):
            group.create_dataset(str(i), data=np.asarray(blob, np.float32))


def read_solverstate(path: PathLike) -> SolverSnapshot:
    """Either format, by suffix as Caffe's Restore; errors name the file."""
    name = os.fspath(path)
    if not os.path.isfile(name):
        raise SolverError("solver state file not found", path=name)
    if is_hdf5_state(name):
        return _read_hdf5(name)
    state = read_binary_proto(name, caffe_pb2.SolverState)
    history = [blob_proto_to_array(b, path=name) for b in state.history]
    return SolverSnapshot(
        state.iter,
        state.current_step,
        state.learned_net if state.HasField("learned_net") else None,
        history,
    )


def _read_hdf5(name: str) -> SolverSnapshot:
    import h5py

    try:
        with h5py.File(name, "r") as h5:
            for key in ("iter", "current_step", "history"):
                if key not in h5:
                    raise SolverError(f"HDF5 solver state has no '{key}'", path=name)
            learned = None
            if "learned_net" in h5:
                raw = h5["learned_net"][()]
                learned = raw.decode() if isinstance(raw, bytes) else str(raw)
            group = h5["history"]
            history = [np.asarray(group[str(i)][()]) for i in range(len(group))]
            return SolverSnapshot(
                int(h5["iter"][()]), int(h5["current_step"][()]), learned, history
            )
    except OSError as err:
        raise SolverError(f"cannot read the HDF5 solver state ({err})", path=name) from None
