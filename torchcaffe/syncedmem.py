"""SyncedMemory: one flat buffer mirrored on the host and a device, copied only when stale.

This is Caffe's SyncedMemory with torch tensors as the two sides. The head says which side is
current (UNINITIALIZED, HEAD_AT_CPU, HEAD_AT_GPU, SYNCED); reading a side copies only when the
other side holds newer data, and asking for a *mutable* side makes it the only current one.
A value can also be *deferred* (``defer``): a callable that yields it, written into the buffer on
the first access of either side, so a forward need not copy blobs that nobody reads. Many
memories can be deferred at once (``BulkDeferral``): a forward renews all of them with one call
instead of one per blob.
Every copy is reported to ``copy_hooks`` so tests and profilers can see exactly when one happens.

The "GPU" side is any torch device: CUDA normally; tests on CPU-only machines pass a second CPU
(or other) device as ``gpu_device`` to exercise the head-state logic.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from functools import partial

import torch

from .errors import DeviceError


class Head(enum.Enum):
    UNINITIALIZED = 0
    HEAD_AT_CPU = 1
    HEAD_AT_GPU = 2
    SYNCED = 3


CopyHook = Callable[["SyncedMemory", str], None]
# called with (memory, "cpu->gpu" | "gpu->cpu" | "deferred") on each copy
copy_hooks: list[CopyHook] = []


def default_gpu_device() -> torch.device:
    """The CUDA device Caffe mode would use; a DeviceError on a machine without CUDA."""
    if not torch.cuda.is_available():
        raise DeviceError(
            "GPU memory requested but CUDA is not available on this machine",
            hint="use caffe.set_mode_cpu(), or install a CUDA build of torch",
        )
    from . import runtime

    return torch.device("cuda", runtime.device_id())


class BulkDeferral:
    """A deferred value for each of many memories, renewed for all of them in one call.

    A memory linked here (``SyncedMemory.link``) under a key takes ``source(key)`` as its
    deferred value whenever ``generation`` has moved past the one it last took, on its next
    access; ``advance`` thus defers every linked memory at once, in O(1) however many there
    are. ``touched`` collects the linked memories accessed since its owner last cleared it:
    a memory gains a view (a numpy array, a tensor) only through an access, so the owner
    looks there, not at every memory, for the ones a live view shows.
    """

    def __init__(self) -> None:
        self.generation = 0
        self.source: Callable[[str], torch.Tensor] | None = None
        self.on_gpu = False
        self.touched: set[SyncedMemory] = set()

    def advance(self, source: Callable[[str], torch.Tensor], on_gpu: bool) -> None:
        """Every linked memory's value is now ``source(key)`` (on the device with ``on_gpu``)."""
        self.generation += 1
        self.source = source
        self.on_gpu = on_gpu


class _BulkValue:
    """A linked memory's deferred value: its bulk deferral's source under its key, read
    when written. Only the generation it was taken in can write it (a later one replaces
    it first), so it holds the bulk, not that generation's source: a memory whose head
    was only looked at does not keep an old run's tensors alive."""

    __slots__ = ("bulk", "key")

    def __init__(self, bulk: BulkDeferral, key: str) -> None:
        self.bulk = bulk
        self.key = key

    def __call__(self) -> torch.Tensor:
        assert self.bulk.source is not None  # set by the first advance, before any link
        return self.bulk.source(self.key)


class SyncedMemory:
    """``count`` elements of ``dtype`` on the host and on ``gpu_device``, synced lazily."""

    # How many times some memory's head moved to HEAD_AT_GPU (the device side alone
    # current), over all memories: while it stays the same, no host side went stale, so a
    # caller that synced the host sides it reads can skip looking at them again.
    device_heads = 0
    # How many times a watched memory's head moved to HEAD_AT_CPU (the host side alone
    # current), or a watched memory left its blob (``Blob``'s memory swaps): the mirror of
    # ``device_heads`` for a reader of the device sides, counting only the memories it
    # watches (a net's params), since a script writes some input's host side on every run.
    watched_host_heads = 0

    def __init__(
        self,
        count: int,
        dtype: torch.dtype = torch.float32,
        gpu_device: torch.device | str | None = None,
    ) -> None:
        self.count = int(count)
        self.dtype = dtype
        self._gpu_device = None if gpu_device is None else torch.device(gpu_device)
        self._cpu: torch.Tensor | None = None
        self._gpu: torch.Tensor | None = None
        self._deferred: Callable[[], torch.Tensor] | None = None
        self._head = Head.UNINITIALIZED
        self._head_before = Head.UNINITIALIZED  # under a deferred value
        self._bulk: BulkDeferral | None = None  # ``link``
        self._bulk_key = ""
        self._bulk_seen = 0  # the generation of ``_bulk`` whose value this memory took
        self.watched = False  # counted in ``watched_host_heads``

    @property
    def head(self) -> Head:
        """Which side holds the current value (a deferred one: the side it will be on)."""
        self._catch_up()
        return self._head

    @head.setter
    def head(self, head: Head) -> None:
        self._catch_up()
        self._move_head(head)

    def _move_head(self, head: Head) -> None:
        """Every change of head after construction comes here, so that each move to the
        device side alone is counted (``device_heads``), and each watched memory's move to
        the host side alone (``watched_host_heads``)."""
        self._head = head
        if head is Head.HEAD_AT_GPU:
            SyncedMemory.device_heads += 1
        elif head is Head.HEAD_AT_CPU and self.watched:
            SyncedMemory.watched_host_heads += 1

    def link(self, bulk: BulkDeferral, key: str) -> None:
        """Follow ``bulk``: its current generation's value under ``key`` is this memory's
        deferred value now, and each later generation's is after it (``BulkDeferral``)."""
        self._bulk, self._bulk_key, self._bulk_seen = bulk, key, bulk.generation - 1

    def unlink(self) -> None:
        """Stop following the bulk deferral, keeping the value it gives now."""
        self._catch_up()
        if isinstance(self._deferred, _BulkValue):  # bound now: later generations move on
            bulk = self._deferred.bulk
            assert bulk.source is not None
            self._deferred = partial(bulk.source, self._deferred.key)
        self._bulk = None

    @property
    def linked_key(self) -> str | None:
        """The key this memory follows its bulk deferral under, if linked."""
        return None if self._bulk is None else self._bulk_key

    def _catch_up(self) -> None:
        """Take the bulk deferral's newer value, if there is one; note the access. Every
        method that reads or writes the value calls this first (a write must not be
        overridden later by a generation it came after)."""
        bulk = self._bulk
        if bulk is None:
            return
        bulk.touched.add(self)
        if self._bulk_seen != bulk.generation:
            self._bulk_seen = bulk.generation
            self._defer(_BulkValue(bulk, self._bulk_key), bulk.on_gpu)

    @property
    def gpu_device(self) -> torch.device:
        if self._gpu_device is None:
            self._gpu_device = default_gpu_device()
        return self._gpu_device

    def _host_buffer(self) -> torch.Tensor:
        """A new host side (uninitialized): page-locked while Caffe's mode is GPU, as Caffe's
        CaffeMallocHost allocates it, so that copies to and from the device go by DMA
        without a staging copy through pageable memory. Never an inference tensor (see
        ``_device_buffer``)."""
        from . import runtime

        pin = runtime.mode() == runtime.GPU and torch.cuda.is_available()
        with torch.inference_mode(False):
            return torch.empty(self.count, dtype=self.dtype, pin_memory=pin)

    def _device_buffer(self, zero: bool) -> torch.Tensor:
        """A new device side. Made outside inference_mode even when first read inside one (a
        forward reading an input blob never written): an inference tensor would refuse the
        in-place writes that come later outside it (a deferred top of an in-place layer,
        a script's ``blob.data[...] = x``)."""
        make = torch.zeros if zero else torch.empty
        with torch.inference_mode(False):
            return make(self.count, dtype=self.dtype, device=self.gpu_device)

    def _report(self, direction: str) -> None:
        for hook in list(copy_hooks):
            hook(self, direction)

    @property
    def deferred(self) -> bool:
        """Is the current value still to be written (``defer``)?"""
        self._catch_up()
        return self._deferred is not None

    def defer(self, value: Callable[[], torch.Tensor], on_gpu: bool = False) -> None:
        """The current value is ``value()`` (at most ``count`` elements; on the device with
        ``on_gpu``, else on the host, which ``head`` names meanwhile), written into the
        buffer of the side first accessed."""
        self._catch_up()
        self._defer(value, on_gpu)

    def _defer(self, value: Callable[[], torch.Tensor], on_gpu: bool) -> None:
        if self._deferred is None:
            self._head_before = self._head
        self._deferred = value
        self._move_head(Head.HEAD_AT_GPU if on_gpu else Head.HEAD_AT_CPU)

    def drop_deferred(self) -> None:
        """Forget a deferred value: the caller overwrites the whole buffer next."""
        self._catch_up()
        if self._deferred is not None:
            self._deferred = None
            self._move_head(self._head_before)  # what the buffers hold

    def _write_deferred(self, to_cpu: bool) -> None:
        """Write the deferred value straight into the side being read (one copy)."""
        deferred, self._deferred = self._deferred, None
        assert deferred is not None
        value = deferred()
        with torch.inference_mode(False):  # a buffer later autograd-recording runs may write
            if to_cpu:
                if self._cpu is None:
                    self._cpu = self._host_buffer().zero_()
                buffer = self._cpu
                self._move_head(Head.HEAD_AT_CPU)
            else:
                if self._gpu is None:
                    self._gpu = self._device_buffer(zero=True)
                buffer = self._gpu
                self._move_head(Head.HEAD_AT_GPU)
            # through a view of the value's shape: a strided (channels_last) value is copied
            # once, in Caffe's order
            buffer[: value.numel()].view(value.shape).copy_(value)
        self._report("deferred")

    def _to_cpu(self) -> None:
        self._catch_up()
        if self._deferred is not None:
            self._write_deferred(to_cpu=True)
        if self._head is Head.UNINITIALIZED:
            self._cpu = self._host_buffer().zero_()
            self._move_head(Head.HEAD_AT_CPU)
        elif self._head is Head.HEAD_AT_GPU:
            assert self._gpu is not None
            if self._cpu is None:
                self._cpu = self._host_buffer()
            if not self._gpu.is_meta:  # a meta "device" (tests) holds no values to copy
                self._cpu.copy_(self._gpu)
            self._report("gpu->cpu")
            self._move_head(Head.SYNCED)

    def _to_gpu(self) -> None:
        self._catch_up()
        if self._deferred is not None:
            self._write_deferred(to_cpu=False)
        if self._head is Head.UNINITIALIZED:
            self._gpu = self._device_buffer(zero=True)
            self._move_head(Head.HEAD_AT_GPU)
        elif self._head is Head.HEAD_AT_CPU:
            assert self._cpu is not None
            if self._gpu is None:
                self._gpu = self._device_buffer(zero=False)
            self._gpu.copy_(self._cpu)
            self._report("cpu->gpu")
            self._move_head(Head.SYNCED)

    def cpu_data(self) -> torch.Tensor:
        self._to_cpu()
        assert self._cpu is not None
        return self._cpu

    def gpu_data(self) -> torch.Tensor:
        self._to_gpu()
        assert self._gpu is not None
        return self._gpu

    def host_alone_current(self) -> torch.Tensor | None:
        """The host buffer when it alone holds the current value (a script just wrote it),
        else None. Reading it moves nothing: a caller that copies it to the device itself
        leaves the device side stale, as the head says."""
        self._catch_up()
        if self._deferred is None and self._head is Head.HEAD_AT_CPU:
            return self._cpu
        return None

    def mutable_cpu_data(self) -> torch.Tensor:
        self._to_cpu()
        self._move_head(Head.HEAD_AT_CPU)
        assert self._cpu is not None
        return self._cpu

    def mutable_gpu_data(self) -> torch.Tensor:
        self._to_gpu()
        self._move_head(Head.HEAD_AT_GPU)
        assert self._gpu is not None
        return self._gpu

    def overwrite(self, on_gpu: bool) -> torch.Tensor:
        """One side's buffer (the device's with ``on_gpu``), made the current value, for a
        caller that writes every element of it next. Unlike ``mutable_*_data``, the other
        side's value is not copied in first (a copy the write makes moot: on a GPU a
        synchronizing transfer, paid by a blob a script read on the host since it was last
        written), and a deferred value is dropped unwritten."""
        self._catch_up()
        self._deferred = None
        if on_gpu:
            if self._gpu is None:
                self._gpu = self._device_buffer(zero=False)
            self._move_head(Head.HEAD_AT_GPU)
            return self._gpu
        if self._cpu is None:
            self._cpu = self._host_buffer()
        self._move_head(Head.HEAD_AT_CPU)
        return self._cpu

    def set_cpu_data(self, tensor: torch.Tensor) -> None:
        """Adopt ``tensor`` (flat, host) as the host side, as Caffe's set_cpu_data."""
        tensor = self._check_external(tensor, torch.device("cpu"))
        self._catch_up()
        self._cpu, self._deferred = tensor, None
        self._move_head(Head.HEAD_AT_CPU)

    def set_gpu_data(self, tensor: torch.Tensor) -> None:
        """Adopt ``tensor`` (flat, device) as the device side, as Caffe's set_gpu_data."""
        tensor = self._check_external(tensor, tensor.device)
        self._catch_up()
        self._gpu, self._deferred = tensor, None
        if self._gpu_device is None:
            self._gpu_device = tensor.device
        self._move_head(Head.HEAD_AT_GPU)

    def take(self, tensor: torch.Tensor) -> bool:
        """Make ``tensor`` (``count`` elements, any shape) the current value on its device's
        side, as a copy into that side's buffer would, but without the copy where no one can
        tell: when no view of the buffer is alive (a numpy array from ``Blob.data`` is one;
        it keeps seeing the buffer, as Caffe's fixed buffers are seen, so then the value is
        copied in), a contiguous ``tensor`` becomes the buffer, and a strided one (e.g.
        channels_last) is deferred: copied into the buffer only when a side is read.
        The caller vouches that nothing else holds ``tensor``. Returns whether it was taken
        without a copy."""
        cpu = tensor.is_cpu
        self._catch_up()
        if self._deferred is not None:
            self.drop_deferred()  # ``tensor`` replaces the whole value
        old = self._cpu if cpu else self._gpu
        free = old is None or (old.device == tensor.device and not _viewed(old))
        if free and tensor.dtype == self.dtype and tensor.numel() == self.count:
            if not tensor.is_contiguous():
                self.defer(lambda: tensor, on_gpu=not cpu)
            elif cpu:  # set_cpu_data's checks hold: one dense buffer of ``count``
                self._cpu = tensor.view(-1)
                self._move_head(Head.HEAD_AT_CPU)
            else:
                self.set_gpu_data(tensor.view(-1))
            return True
        self.overwrite(on_gpu=not cpu).view(tensor.shape).copy_(tensor)
        return False

    def release(self) -> bool:
        """Drop both sides' buffers, because the caller replaces the whole value next and
        their memory can then hold it (holding the old value while the new one is made
        would take twice the memory). A buffer someone views is kept, and False returned:
        the view must keep seeing this memory. Read before it is written again, the value
        is zeros (UNINITIALIZED), as Caffe's fresh memory."""
        if self.viewed():
            return False
        self._catch_up()  # its pending value is replaced too
        self._cpu = self._gpu = self._deferred = None
        self._head_before = Head.UNINITIALIZED
        self._move_head(Head.UNINITIALIZED)
        return True

    def cpu_users(self) -> int:
        """``storage_users`` of the host buffer (0 before there is one)."""
        return 0 if self._cpu is None else storage_users(self._cpu)

    def viewed(self) -> bool:
        """Does anyone outside this object hold a view of either side's buffer (a numpy array
        from ``Blob.data``, a tensor from ``cpu_data``)?"""
        cpu, gpu = self._cpu, self._gpu  # asked of every blob on each Caffe-face forward
        return (cpu is not None and _viewed(cpu)) or (gpu is not None and _viewed(gpu))

    def _check_external(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        if tensor.numel() != self.count or tensor.dim() != 1:
            raise DeviceError(
                "external buffer has the wrong size",
                expected=f"a flat tensor of {self.count} elements",
                got=tuple(tensor.shape),
            )
        if tensor.device.type != device.type:
            raise DeviceError(
                "external buffer is on the wrong device", expected=device, got=tensor.device
            )
        return tensor

    def __repr__(self) -> str:
        return f"SyncedMemory(count={self.count}, head={self.head.name})"


def _viewed(buffer: torch.Tensor) -> bool:
    """Does anything besides ``buffer`` (and the base it views) reference its memory: a
    view, a numpy array? (The storage object asked here counts one more reference.)"""
    own = 2 + (buffer._base is not None)
    return storage_users(buffer) > own


def storage_users(buffer: torch.Tensor) -> int:
    """How many tensors and numpy arrays reference ``buffer``'s memory, plus one for the
    storage object this query makes."""
    return torch._C._storage_Use_Count(buffer.untyped_storage()._cdata)
