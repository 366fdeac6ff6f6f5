"""Blob: Caffe's N-d array with ``data`` and ``diff``, each a SyncedMemory over torch tensors.

Used by the Caffe face, weights I/O and data layers; layers and Net.forward never see a Blob.
Reshape keeps the buffers while the new count fits the capacity (reallocating only on growth),
and ``data``/``diff`` are writable numpy views of the host side, as in pycaffe. A forward
that defers writing a blob nobody reads (``SyncedMemory.defer``) still writes at once the blobs
a live view shows (``has_live_views``).
``before_write`` (when set) runs before the data is handed out writable: a net whose deferred
blobs are recomputed from its params settles them before a param may change.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch

from .errors import BlobShapeError, UsageError
from .proto import caffe_pb2
from .syncedmem import Head, SyncedMemory

MAX_BLOB_AXES = 32
INT_MAX = 2**31 - 1


class Count(int):
    """An element count that is also Caffe's ``count(start, end)`` over the shape's axes."""

    shape: tuple[int, ...]

    def __new__(cls, value: int, shape: tuple[int, ...]) -> Count:
        obj = super().__new__(cls, value)
        obj.shape = shape
        return obj

    def __call__(self, start: int | None = None, end: int | None = None) -> int:
        if start is None:
            return int(self)
        num_axes = len(self.shape)
        end = num_axes if end is None else end
        if not 0 <= start <= end <= num_axes:
            raise BlobShapeError(
                "count range out of bounds",
                expected=f"0 <= start <= end <= {num_axes}",
                got=(start, end),
            )
        return math.prod(self.shape[start:end])


class Blob:
    """An N-d float blob with data and diff; ``gpu_device`` is forwarded to SyncedMemory."""

    def __init__(
        self,
        shape: Sequence[int] | None = None,
        dtype: torch.dtype = torch.float32,
        gpu_device: torch.device | str | None = None,
    ) -> None:
        self.dtype = dtype
        self.gpu_device = gpu_device
        self._shape: tuple[int, ...] = ()
        self._count = 0
        self.capacity = 0
        self._data = SyncedMemory(0, dtype, gpu_device)
        self._diff = SyncedMemory(0, dtype, gpu_device)
        self.before_write: Callable[[], None] | None = None
        # called when the shape or a memory changes (a lazy forward keeps both between runs)
        self.on_layout_change: Callable[[], None] | None = None
        if shape is not None:  # Caffe: Blob() is empty; a 0-axis shape holds one scalar
            self.reshape(shape)

    # -- shape ------------------------------------------------------------------------------
    def reshape(self, *shape) -> None:
        """Reshape; accepts ``reshape(2, 3)``, ``reshape((2, 3))`` or a BlobShape."""
        if len(shape) == 1 and isinstance(shape[0], caffe_pb2.BlobShape):
            dims = tuple(int(d) for d in shape[0].dim)
        elif len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            dims = _int_dims(shape[0])
        else:
            dims = _int_dims(shape)
        if len(dims) > MAX_BLOB_AXES:
            raise BlobShapeError("too many axes", expected=f"<= {MAX_BLOB_AXES}", got=len(dims))
        count = 1
        for d in dims:
            if d < 0:
                raise BlobShapeError("negative blob dimension", expected=">= 0", got=dims)
            count *= d
        if count > INT_MAX:
            raise BlobShapeError("blob size exceeds INT_MAX", expected=f"<= {INT_MAX}", got=count)
        self._shape = dims
        self._count = count
        # a memory shared from a smaller blob (share_data) cannot hold more than its count
        if count > self.capacity or count > min(self._data.count, self._diff.count):
            self.capacity = count
            self._new_memories(count)
        self._layout_changed()

    def _new_memories(self, count: int) -> None:
        self._replace_memories(
            SyncedMemory(count, self.dtype, self.gpu_device),
            SyncedMemory(count, self.dtype, self.gpu_device),
        )

    def _replace_memories(self, data: SyncedMemory, diff: SyncedMemory) -> None:
        """Every change of memory comes here: a watched memory that leaves is counted
        (``SyncedMemory.watched_host_heads``), so that its watcher looks at the new one."""
        if self._data.watched or self._diff.watched:
            SyncedMemory.watched_host_heads += 1
        self._data, self._diff = data, diff

    def _layout_changed(self) -> None:
        if self.on_layout_change is not None:
            self.on_layout_change()

    def reshape_like(self, other: Blob) -> None:
        self.reshape(other.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def shape_string(self) -> str:
        return " ".join(str(d) for d in self._shape) + f" ({self._count})"

    @property
    def num_axes(self) -> int:
        return len(self._shape)

    def canonical_axis_index(self, axis: int) -> int:
        n = self.num_axes
        if not -n <= axis < n:
            raise BlobShapeError(
                f"axis {axis} out of range for a {n}-D blob with shape {self.shape_string()}",
                expected=f"{-n} <= axis < {n}",
                got=axis,
            )
        return axis + n if axis < 0 else axis

    def shape_at(self, axis: int) -> int:
        return self._shape[self.canonical_axis_index(axis)]

    @property
    def count(self) -> Count:
        """Element count: an int, as pycaffe's ``blob.count``; callable as Caffe's
        ``count()``, ``count(start)`` and ``count(start, end)``."""
        return Count(self._count, self._shape)

    def legacy_shape(self, index: int) -> int:
        """Caffe's LegacyShape: axes past a <= 4-D shape read as 1."""
        if self.num_axes > 4:
            raise BlobShapeError(
                "legacy accessors need a blob of at most 4 axes",
                expected="<= 4 axes",
                got=self.num_axes,
            )
        if not -4 <= index < 4:
            raise BlobShapeError("legacy axis index out of range", expected="-4..3", got=index)
        if index >= self.num_axes or index < -self.num_axes:
            return 1
        return self.shape_at(index)

    @property
    def num(self) -> int:
        return self.legacy_shape(0)

    @property
    def channels(self) -> int:
        return self.legacy_shape(1)

    @property
    def height(self) -> int:
        return self.legacy_shape(2)

    @property
    def width(self) -> int:
        return self.legacy_shape(3)

    def offset(self, *indices) -> int:
        """Flat offset of (n, c, h, w) or of an index list, as Caffe's offset()."""
        if len(indices) == 1 and not isinstance(indices[0], (int, np.integer)):
            idx = [int(i) for i in indices[0]]
            if len(idx) > self.num_axes:
                raise BlobShapeError(
                    "too many indices", expected=f"<= {self.num_axes}", got=len(idx)
                )
            off = 0
            for axis in range(self.num_axes):
                off *= self._shape[axis]
                if axis < len(idx):
                    if not 0 <= idx[axis] < self._shape[axis]:
                        raise BlobShapeError(
                            f"index out of range on axis {axis}",
                            expected=f"0..{self._shape[axis] - 1}",
                            got=idx[axis],
                        )
                    off += idx[axis]
            return off
        n, c, h, w = (list(indices) + [0, 0, 0, 0])[:4]
        dims = (self.num, self.channels, self.height, self.width)
        for name, i, d in zip("nchw", (n, c, h, w), dims):
            if not 0 <= i <= d:
                raise BlobShapeError(f"index {name} out of range", expected=f"0..{d}", got=i)
        return ((n * self.channels + c) * self.height + h) * self.width + w

    # -- memory -----------------------------------------------------------------------------
    def _view(self, flat: torch.Tensor) -> torch.Tensor:
        return flat[: self._count].view(self._shape)

    def has_live_views(self) -> bool:
        """Does someone still hold a view (numpy or tensor) of this blob's data buffers?"""
        return self._data.viewed()

    def cpu_data(self) -> torch.Tensor:
        return self._view(self._data.cpu_data())

    def mutable_cpu_data(self) -> torch.Tensor:
        if self.before_write is not None:
            self.before_write()
        return self._view(self._data.mutable_cpu_data())

    def gpu_data(self) -> torch.Tensor:
        return self._view(self._data.gpu_data())

    def mutable_gpu_data(self) -> torch.Tensor:
        if self.before_write is not None:
            self.before_write()
        return self._view(self._data.mutable_gpu_data())

    def cpu_diff(self) -> torch.Tensor:
        return self._view(self._diff.cpu_data())

    def mutable_cpu_diff(self) -> torch.Tensor:
        return self._view(self._diff.mutable_cpu_data())

    def gpu_diff(self) -> torch.Tensor:
        return self._view(self._diff.gpu_data())

    def mutable_gpu_diff(self) -> torch.Tensor:
        return self._view(self._diff.mutable_gpu_data())

    def data_at(self, device: torch.device, mutable: bool = False) -> torch.Tensor:
        """Data on the host or the device side, whichever ``device`` names."""
        if device.type == "cpu":
            return self.mutable_cpu_data() if mutable else self.cpu_data()
        return self.mutable_gpu_data() if mutable else self.gpu_data()

    def data_to_overwrite(self, device: torch.device) -> torch.Tensor:
        """``data_at(device, mutable=True)`` for a caller that writes every element next:
        the other side's value is not synced over first (``SyncedMemory.overwrite``)."""
        if self.before_write is not None:
            self.before_write()
        return self._to_overwrite(self._data, device)

    def diff_to_overwrite(self, device: torch.device) -> torch.Tensor:
        """``data_to_overwrite`` for the diff."""
        return self._to_overwrite(self._diff, device)

    def _to_overwrite(self, memory: SyncedMemory, device: torch.device) -> torch.Tensor:
        on_gpu = device.type != "cpu"
        if memory.count != self._count:  # a larger capacity: the rest keeps its value
            return self._view(memory.mutable_gpu_data() if on_gpu else memory.mutable_cpu_data())
        return self._view(memory.overwrite(on_gpu))

    def data_copy_at(self, device: torch.device) -> torch.Tensor:
        """A new tensor on ``device``'s side holding this blob's data, which nothing else
        holds. On a device, data a script just wrote on the host is copied straight into it:
        one copy, where syncing the device side first and cloning it made two."""
        if device.type != "cpu":
            host = self._data.host_alone_current()
            if host is not None:
                return self._view(host).to(device)
        return self.data_at(device).clone()

    def diff_at(self, device: torch.device, mutable: bool = False) -> torch.Tensor:
        if device.type == "cpu":
            return self.mutable_cpu_diff() if mutable else self.cpu_diff()
        return self.mutable_gpu_diff() if mutable else self.gpu_diff()

    def take_data(self, tensor: torch.Tensor) -> bool:
        """Set the data on ``tensor``'s side to ``tensor`` (this blob's shape), adopting it
        instead of copying where no one can tell (``SyncedMemory.take``)."""
        return self._take(self._data, tensor)

    def take_diff(self, tensor: torch.Tensor) -> bool:
        """``take_data`` for the diff."""
        return self._take(self._diff, tensor)

    def _take(self, memory: SyncedMemory, tensor: torch.Tensor) -> bool:
        if tuple(tensor.shape) != self._shape:
            raise BlobShapeError(
                "take: tensor of another shape", expected=self._shape, got=tuple(tensor.shape)
            )
        if memory.count != self._count:  # a larger capacity is kept, as Caffe keeps it
            target = self.data_at if memory is self._data else self.diff_at
            target(tensor.device, mutable=True).copy_(tensor)
            return False
        return memory.take(tensor)

    @property
    def data_memory(self) -> SyncedMemory:
        return self._data

    @property
    def diff_memory(self) -> SyncedMemory:
        return self._diff

    def set_cpu_data(self, tensor: torch.Tensor) -> None:
        """Adopt an external host tensor (same count) as the data, as Caffe's set_cpu_data."""
        if self.before_write is not None:
            self.before_write()
        flat = tensor.reshape(-1)
        if flat.numel() != self._count:
            raise BlobShapeError(
                "set_cpu_data with a tensor of another size", expected=self._count, got=flat.numel()
            )
        if self._data.count != self._count:
            self._new_memories(self._count)
            self._layout_changed()
        self._data.set_cpu_data(flat)

    def share_data(self, other: Blob) -> None:
        """Use ``other``'s data memory (same count required), as Caffe's ShareData."""
        if other.count() != self._count:
            raise BlobShapeError(
                "share_data between blobs of different counts",
                expected=self._count,
                got=other.count(),
            )
        self._replace_memories(other._data, self._diff)
        self._layout_changed()

    def share_diff(self, other: Blob) -> None:
        if other.count() != self._count:
            raise BlobShapeError(
                "share_diff between blobs of different counts",
                expected=self._count,
                got=other.count(),
            )
        self._replace_memories(self._data, other._diff)
        self._layout_changed()

    def copy_from(self, source: Blob, copy_diff: bool = False, reshape: bool = False) -> None:
        if source.count() != self._count or source.shape != self.shape:
            if reshape:
                self.reshape_like(source)
            else:
                raise BlobShapeError(
                    "copy_from a blob of another shape",
                    expected=self.shape,
                    got=source.shape,
                    hint="pass reshape=True to adopt the source shape",
                )
        if copy_diff:
            self.mutable_cpu_diff().copy_(source.cpu_diff())
        else:
            self.mutable_cpu_data().copy_(source.cpu_data())

    # -- math (Caffe's Update, asum, sumsq, scale) -----------------------------------------
    def _side(self) -> str:
        head = self._data.head.name
        return "gpu" if head in ("HEAD_AT_GPU", "SYNCED") else "cpu"

    def update(self) -> None:
        """data -= diff, on whichever side holds the current data (Caffe's Update)."""
        if self._side() == "gpu":
            self.mutable_gpu_data().sub_(self.gpu_diff())
        else:
            self.mutable_cpu_data().sub_(self.cpu_diff())

    def asum_data(self) -> float:
        return float(self.cpu_data().abs().sum()) if self._count else 0.0

    def asum_diff(self) -> float:
        return float(self.cpu_diff().abs().sum()) if self._count else 0.0

    def sumsq_data(self) -> float:
        return float(self.cpu_data().pow(2).sum()) if self._count else 0.0

    def sumsq_diff(self) -> float:
        return float(self.cpu_diff().pow(2).sum()) if self._count else 0.0

    def scale_data(self, factor: float) -> None:
        if self._count:
            self.mutable_cpu_data().mul_(factor)

    def scale_diff(self, factor: float) -> None:
        if self._count:
            self.mutable_cpu_diff().mul_(factor)

    # -- pycaffe's numpy views ---------------------------------------------------------------
    @property
    def data(self) -> np.ndarray:
        """Writable numpy view of the host data (marks the host side current)."""
        return self.mutable_cpu_data().numpy()

    @data.setter
    def data(self, value) -> None:
        self.data[...] = value

    @property
    def diff(self) -> np.ndarray:
        return self.mutable_cpu_diff().numpy()

    @diff.setter
    def diff(self, value) -> None:
        self.diff[...] = value

    # -- proto ----------------------------------------------------------------------------
    def shape_equals(self, proto: caffe_pb2.BlobProto) -> bool:
        """Caffe's ShapeEquals: legacy 4-D fields compare against LegacyShape."""
        if any(proto.HasField(f) for f in ("num", "channels", "height", "width")):
            if self.num_axes > 4:
                return False
            return (
                self.legacy_shape(-4),
                self.legacy_shape(-3),
                self.legacy_shape(-2),
                self.legacy_shape(-1),
            ) == (proto.num, proto.channels, proto.height, proto.width)
        return tuple(proto.shape.dim) == self.shape

    def from_proto(self, proto: caffe_pb2.BlobProto, reshape: bool = True) -> None:
        from .formats.binaryproto import blob_proto_to_array

        array = blob_proto_to_array(proto)
        if reshape:
            self.reshape(array.shape)
        elif not self.shape_equals(proto):
            raise BlobShapeError(
                "shape mismatch (reshape not set)", expected=self.shape, got=array.shape
            )
        self.mutable_cpu_data().copy_(torch.from_numpy(array.reshape(self.shape)))
        diff = _proto_diff(proto)
        if diff is not None:
            if diff.size != self._count:
                raise BlobShapeError(
                    "diff size does not match the blob", expected=self._count, got=diff.size
                )
            self.mutable_cpu_diff().copy_(torch.from_numpy(diff.reshape(self.shape)))

    def to_proto(self, write_diff: bool = False) -> caffe_pb2.BlobProto:
        proto = caffe_pb2.BlobProto()
        proto.shape.dim.extend(self._shape)
        if self.dtype == torch.float64:
            proto.double_data.extend(self.cpu_data().reshape(-1).tolist())
            if write_diff:
                proto.double_diff.extend(self.cpu_diff().reshape(-1).tolist())
        else:
            proto.data.extend(self.cpu_data().reshape(-1).float().numpy())
            if write_diff:
                proto.diff.extend(self.cpu_diff().reshape(-1).float().numpy())
        return proto

    def __repr__(self) -> str:
        return f"Blob(shape={self.shape}, data={self._data.head.name})"


def _int_dims(shape: Iterable) -> tuple[int, ...]:
    """Each dimension as an int; a float or a string is refused (pycaffe's Blob.reshape
    extracts C++ ints, a TypeError for 2.5 or "3"), never truncated as ``int()`` would."""
    try:
        return tuple(operator.index(d) for d in shape)
    except TypeError:
        raise UsageError(
            "blob dimensions must be integers", expected="ints", got=tuple(shape)
        ) from None


def memories_at(blobs: Iterable[Blob], head: Head) -> list[SyncedMemory]:
    """The data and diff memories of ``blobs`` whose head is ``head``. The Caffe face asks
    this of every param blob on each run, so it reads the memories directly (the properties
    cost twice the scan)."""
    found = []
    for blob in blobs:
        data, diff = blob._data, blob._diff
        # ``_head`` where no bulk deferral can move it (a param's memory never follows one)
        if (data._head if data._bulk is None else data.head) is head:
            found.append(data)
        if (diff._head if diff._bulk is None else diff.head) is head:
            found.append(diff)
    return found


def watch_memories(blobs: Iterable[Blob]) -> None:
    """Count moves of these blobs' memories to the host side alone, and their replacement
    (``SyncedMemory.watched_host_heads``): in GPU mode the Caffe face then looks at its
    params' host sides only when that count moved."""
    for blob in blobs:
        blob._data.watched = blob._diff.watched = True


def _proto_diff(proto: caffe_pb2.BlobProto) -> np.ndarray | None:
    if len(proto.double_diff):
        return np.asarray(proto.double_diff, dtype=np.float64)
    if len(proto.diff):
        return np.asarray(proto.diff, dtype=np.float32)
    return None
