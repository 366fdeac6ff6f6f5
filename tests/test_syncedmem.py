"""SyncedMemory head states: copies happen exactly where Caffe's documentation says.

The sequence is the one in Caffe's "Blobs, Layers, and Nets" tutorial. On a CPU-only machine
the "GPU" side is a second host buffer (or the meta device); on CUDA it is the real GPU.
"""

from __future__ import annotations

import pytest
import torch

from torchcaffe import syncedmem
from torchcaffe.blob import Blob, watch_memories
from torchcaffe.errors import DeviceError
from torchcaffe.syncedmem import Head, SyncedMemory

SECOND_DEVICES = ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture
def copies():
    seen: list[str] = []

    def hook(mem, direction):
        seen.append(direction)

    syncedmem.copy_hooks.append(hook)
    yield seen
    syncedmem.copy_hooks.remove(hook)


@pytest.mark.parametrize("gpu", SECOND_DEVICES)
def test_tutorial_sequence_copies_only_when_stale(gpu, copies):
    blob = Blob((2, 3), gpu_device=gpu)
    blob.mutable_cpu_data().copy_(torch.arange(6.0).view(2, 3))  # data on the CPU initially
    steps = [
        ("gpu_data", ["cpu->gpu"]),
        ("cpu_data", []),
        ("mutable_gpu_data", []),
        ("mutable_gpu_data", []),
        ("cpu_data", ["gpu->cpu"]),
        ("gpu_data", []),
        ("mutable_cpu_data", []),
        ("mutable_gpu_data", ["cpu->gpu"]),
        ("mutable_cpu_data", ["gpu->cpu"]),
    ]
    for call, expected in steps:
        del copies[:]
        getattr(blob, call)()
        assert copies == expected, f"{call}: copies {copies}, expected {expected}"


@pytest.mark.parametrize("gpu", [d for d in SECOND_DEVICES if d != "meta"])
def test_values_follow_the_head(gpu):
    blob = Blob((4,), gpu_device=gpu)
    blob.mutable_cpu_data().fill_(1.0)
    blob.mutable_gpu_data().add_(2.0)  # GPU now holds 3, CPU stale
    assert blob.data_memory.head is Head.HEAD_AT_GPU
    assert torch.equal(blob.cpu_data(), torch.full((4,), 3.0))
    assert blob.data_memory.head is Head.SYNCED


def test_uninitialized_allocates_zeros_without_copy(copies):
    mem = SyncedMemory(5, gpu_device="cpu")
    assert mem.head is Head.UNINITIALIZED
    assert torch.equal(mem.gpu_data(), torch.zeros(5))
    assert mem.head is Head.HEAD_AT_GPU and copies == []
    mem2 = SyncedMemory(5, gpu_device="cpu")
    mem2.mutable_cpu_data()
    assert mem2.head is Head.HEAD_AT_CPU and copies == []


def test_lazy_allocation_only_touched_side():
    mem = SyncedMemory(3, gpu_device="cpu")
    mem.cpu_data()
    assert mem._gpu is None  # the other side is allocated only when asked for


def test_set_cpu_data_adopts_buffer():
    mem = SyncedMemory(3, gpu_device="cpu")
    ext = torch.tensor([1.0, 2.0, 3.0])
    mem.set_cpu_data(ext)
    assert mem.head is Head.HEAD_AT_CPU
    mem.mutable_cpu_data()[0] = 7.0
    assert ext[0] == 7.0
    with pytest.raises(DeviceError, match="wrong size"):
        mem.set_cpu_data(torch.zeros(4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_gpu_calls_without_cuda_raise_clear_error():
    blob = Blob((2,))
    with pytest.raises(DeviceError, match="CUDA is not available"):
        blob.gpu_data()


@pytest.mark.parametrize("on_gpu", [False, True])
def test_deferred_value_is_written_on_first_access_only(on_gpu, copies):
    mem = SyncedMemory(4, gpu_device="cpu")
    calls = []

    def value():
        calls.append(1)
        return torch.arange(3.0)

    mem.defer(value, on_gpu=on_gpu)
    assert mem.deferred and not calls  # nothing written yet
    assert mem.head is (Head.HEAD_AT_GPU if on_gpu else Head.HEAD_AT_CPU)
    assert torch.equal(mem.cpu_data()[:3], torch.arange(3.0))  # written into the host side
    assert mem.head is Head.HEAD_AT_CPU and copies == ["deferred"]
    assert torch.equal(mem.gpu_data()[:3], torch.arange(3.0))
    assert calls == [1] and not mem.deferred
    assert copies == ["deferred", "cpu->gpu"]


def test_dropped_or_replaced_deferred_value_is_never_computed():
    mem = SyncedMemory(2)

    def fail():
        raise AssertionError("computed")

    mem.defer(fail)
    mem.drop_deferred()
    assert mem.head is Head.UNINITIALIZED  # the buffers hold what they held
    mem.mutable_cpu_data().fill_(1.0)
    mem.defer(fail)
    mem.set_cpu_data(torch.full((2,), 2.0))
    assert torch.equal(mem.cpu_data(), torch.full((2,), 2.0))


@pytest.mark.parametrize("gpu", SECOND_DEVICES)
def test_a_whole_overwrite_copies_nothing_from_the_stale_side(gpu, copies):
    """A writer of every element takes its side's buffer without the other side's value
    copied in first (``mutable_*_data`` would copy it)."""
    mem = SyncedMemory(3, gpu_device=gpu)
    mem.mutable_cpu_data().fill_(1.0)  # the host side alone current
    mem.overwrite(on_gpu=True).fill_(2.0)
    assert copies == [] and mem.head is Head.HEAD_AT_GPU
    mem.overwrite(on_gpu=False).fill_(3.0)
    assert copies == [] and mem.head is Head.HEAD_AT_CPU
    assert mem.cpu_data().tolist() == [3.0] * 3
    mem.defer(lambda: torch.full((3,), 4.0), on_gpu=True)
    mem.overwrite(on_gpu=False)
    assert copies == [] and not mem.deferred  # the deferred value is dropped unwritten


@pytest.mark.parametrize("gpu", [d for d in SECOND_DEVICES if d != "cpu"])
def test_a_blob_overwrites_the_side_its_device_names_keeping_a_larger_capacity(gpu, copies):
    """``Blob.data_to_overwrite``/``diff_to_overwrite`` on the device's side; a blob whose
    memory is larger than its count keeps the rest, so it gets the synced buffer."""
    device = torch.device(gpu)
    blob = Blob((2, 3), gpu_device=gpu)
    blob.mutable_cpu_data().fill_(1.0)
    blob.data_to_overwrite(device).fill_(2.0)
    blob.mutable_cpu_diff()
    blob.diff_to_overwrite(device)
    assert copies == [] and blob.data_memory.head is blob.diff_memory.head is Head.HEAD_AT_GPU
    blob.reshape(1, 3)  # capacity 6 kept: the other 3 elements must survive
    blob.mutable_cpu_data()
    del copies[:]
    blob.data_to_overwrite(device)
    assert copies == ["cpu->gpu"]


def test_take_into_a_viewed_buffer_does_not_sync_the_other_side_first(copies):
    """``take`` copying into a held buffer writes all of it: the other side's older value
    is not copied over first."""
    mem = SyncedMemory(4, gpu_device="meta")
    mem.mutable_gpu_data()
    held = mem.mutable_cpu_data().numpy()  # viewed, and synced from the device
    mem.mutable_gpu_data()  # the device side alone current again
    del copies[:]
    assert not mem.take(torch.full((4,), 7.0))
    assert copies == [] and mem.head is Head.HEAD_AT_CPU and held.tolist() == [7.0] * 4


def test_take_adopts_an_unviewed_buffer_and_copies_into_a_viewed_one():
    """``take`` replaces the host buffer when nothing views it; a held numpy view (as from
    ``Blob.data``) keeps its buffer, which then receives the value."""
    mem = SyncedMemory(4)
    mem.mutable_cpu_data().fill_(1)
    fresh = torch.arange(4.0)
    assert mem.take(fresh)
    assert mem.cpu_data().data_ptr() == fresh.data_ptr() and mem.head is Head.HEAD_AT_CPU
    held = mem.mutable_cpu_data().numpy()
    assert not mem.take(torch.full((4,), 7.0))
    assert held.tolist() == [7.0] * 4 and mem.cpu_data().data_ptr() == fresh.data_ptr()
    del held
    assert mem.take(torch.zeros(4))  # the view is gone: adopt again
    assert not mem.take(torch.zeros(4, dtype=torch.float64))  # another dtype: copied


def test_take_keeps_a_strided_value_until_a_side_is_read(copies):
    """A channels_last value (CPU pooling's gradients) is not copied into the flat buffer
    until someone reads it; a later take replaces it without that copy ever happening."""
    mem = SyncedMemory(2 * 3 * 2 * 2)
    mem.mutable_cpu_data()
    value = torch.arange(24.0).view(2, 3, 2, 2).contiguous(memory_format=torch.channels_last)
    assert mem.take(value)
    assert mem.deferred and mem.head is Head.HEAD_AT_CPU and copies == []
    later = torch.ones(2, 3, 2, 2).contiguous(memory_format=torch.channels_last)
    assert mem.take(later) and mem.deferred and copies == []  # replaced, never copied
    assert mem.cpu_data().tolist() == [1.0] * 24 and not mem.deferred
    assert copies == ["deferred"]  # one copy, on the read
    assert mem.take(value) and mem.mutable_cpu_data().view(2, 3, 2, 2).equal(value)
    held = mem.mutable_cpu_data().numpy()
    assert not mem.take(later)  # a held view: copied in at once, in Caffe's NCHW order
    assert held.tolist() == [1.0] * 24


def test_deferred_and_taken_values_replace_each_other():
    """The newer of a deferred (inference) and a taken (training) value is the value."""
    mem = SyncedMemory(8)
    mem.mutable_cpu_data().fill_(1)
    mem.defer(lambda: torch.full((8,), 5.0))
    assert mem.take(torch.full((8,), 7.0)) and not mem.deferred
    assert mem.cpu_data().tolist() == [7.0] * 8
    nhwc = torch.zeros(1, 2, 2, 2).contiguous(memory_format=torch.channels_last)
    assert mem.take(nhwc) and mem.deferred
    mem.defer(lambda: torch.full((8,), 9.0))
    assert mem.cpu_data().tolist() == [9.0] * 8


@pytest.mark.parametrize("gpu", SECOND_DEVICES)
def test_release_drops_both_sides_unless_a_buffer_is_viewed(gpu, copies):
    mem = SyncedMemory(4, gpu_device=gpu)
    mem.mutable_cpu_data().fill_(3.0)
    mem.gpu_data()  # both sides hold the value
    mem.defer(lambda: torch.ones(4))
    assert mem.release()
    assert mem.head is Head.UNINITIALIZED and mem._cpu is None and mem._gpu is None
    assert mem.cpu_data().tolist() == [0.0] * 4  # fresh memory again: zeros, no copy
    view = mem.cpu_data()[1:]  # someone holds the buffer now
    mem.mutable_cpu_data().fill_(2.0)
    assert not mem.release()
    assert mem.head is Head.HEAD_AT_CPU and view.tolist() == [2.0] * 3
    assert copies == ["cpu->gpu"]  # the deferred value was never computed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked memory needs CUDA")
@pytest.mark.parametrize("mode", ["gpu", "cpu"])
def test_host_side_is_page_locked_in_gpu_mode_as_caffes(mode):
    import torchcaffe

    (torchcaffe.set_mode_gpu if mode == "gpu" else torchcaffe.set_mode_cpu)()
    try:
        mem = SyncedMemory(8, gpu_device="cuda")
        mem.mutable_gpu_data().fill_(2)
        assert mem.cpu_data().is_pinned() == (mode == "gpu")
        assert mem.cpu_data().tolist() == [2.0] * 8
        fresh = SyncedMemory(8, gpu_device="cuda")
        assert fresh.mutable_cpu_data().is_pinned() == (mode == "gpu")
    finally:
        torchcaffe.set_mode_cpu()


def _source(base: float, calls: list[str] | None = None):
    """A bulk deferral's source: key "k<i>" -> [base + i] * 2."""

    def value(key: str) -> torch.Tensor:
        if calls is not None:
            calls.append(key)
        return torch.full((2,), base + int(key[1:]))

    return value


def test_bulk_deferral_defers_every_linked_memory_with_one_advance(copies):
    bulk = syncedmem.BulkDeferral()
    calls: list[str] = []
    bulk.advance(_source(10.0, calls), on_gpu=False)
    mems = [SyncedMemory(2) for _ in range(3)]
    for i, mem in enumerate(mems):
        mem.link(bulk, f"k{i}")
    assert all(mem.deferred for mem in mems) and not calls  # nothing computed yet
    assert mems[1].cpu_data().tolist() == [11.0, 11.0] and calls == ["k1"]
    bulk.advance(_source(20.0, calls), on_gpu=False)
    assert all(mem.deferred for mem in mems)  # the one read is deferred again
    assert [m.cpu_data()[0].item() for m in mems] == [20.0, 21.0, 22.0]
    assert calls == ["k1", "k0", "k1", "k2"] and copies == ["deferred"] * 4
    assert mems[0].cpu_data().tolist() == [20.0, 20.0] and len(calls) == 4  # written once


def test_bulk_deferral_head_and_side_follow_the_generation():
    bulk = syncedmem.BulkDeferral()
    bulk.advance(_source(0.0), on_gpu=False)
    mem = SyncedMemory(2, gpu_device="cpu")
    mem.link(bulk, "k1")
    assert mem.head is Head.HEAD_AT_CPU
    bulk.advance(_source(5.0), on_gpu=True)
    assert mem.head is Head.HEAD_AT_GPU  # the pending value lives on the device side
    assert mem.gpu_data().tolist() == [6.0, 6.0] and mem.head is Head.HEAD_AT_GPU
    assert mem.cpu_data().tolist() == [6.0, 6.0] and mem.head is Head.SYNCED


@pytest.mark.parametrize(
    "write",
    [
        lambda m: m.mutable_cpu_data().fill_(-1.0),
        lambda m: m.set_cpu_data(torch.full((2,), -1.0)),
        lambda m: m.take(torch.full((2,), -1.0)),
        lambda m: (m.drop_deferred(), m.mutable_cpu_data().fill_(-1.0)),
    ],
)
def test_a_write_after_an_advance_is_not_undone_by_it(write):
    """A write made after a generation began is newer than that generation's value: reads
    see the write until the next advance, which replaces it."""
    bulk = syncedmem.BulkDeferral()
    bulk.advance(_source(0.0), on_gpu=False)
    mem = SyncedMemory(2)
    mem.link(bulk, "k3")
    write(mem)
    assert not mem.deferred and mem.cpu_data().tolist() == [-1.0, -1.0]
    bulk.advance(_source(10.0), on_gpu=False)
    assert mem.cpu_data().tolist() == [13.0, 13.0]


def test_unlink_keeps_the_value_of_the_generation_it_left():
    bulk = syncedmem.BulkDeferral()
    bulk.advance(_source(0.0), on_gpu=False)
    mem = SyncedMemory(2)
    mem.link(bulk, "k2")
    mem.unlink()
    bulk.advance(_source(50.0), on_gpu=False)
    assert mem.linked_key is None and mem.cpu_data().tolist() == [2.0, 2.0]


def test_release_of_a_linked_memory_drops_its_pending_value():
    bulk = syncedmem.BulkDeferral()
    bulk.advance(_source(0.0), on_gpu=False)
    mem = SyncedMemory(2)
    mem.link(bulk, "k1")
    assert mem.release() and mem.head is Head.UNINITIALIZED
    assert mem.cpu_data().tolist() == [0.0, 0.0]  # fresh memory, as Caffe's


def test_bulk_deferral_touched_holds_the_memories_accessed():
    bulk = syncedmem.BulkDeferral()
    bulk.advance(_source(0.0), on_gpu=False)
    a, b = SyncedMemory(2), SyncedMemory(2)
    a.link(bulk, "k0")
    b.link(bulk, "k1")
    assert bulk.touched == set()
    view = b.cpu_data().numpy()  # as Blob.data hands out
    assert bulk.touched == {b} and b.viewed()
    bulk.touched.clear()
    bulk.advance(_source(1.0), on_gpu=False)
    assert bulk.touched == set()  # an advance alone touches nothing
    del view
    assert not a.viewed() and a.head is Head.HEAD_AT_CPU and bulk.touched == {a}


def _to_device_side_ops():
    def deferred_then_dropped(mem):
        mem.mutable_gpu_data()
        mem.defer(lambda: torch.zeros(2))  # host side: not counted
        before = SyncedMemory.device_heads
        mem.drop_deferred()  # back to the device side
        return before

    def deferred_then_written(mem):
        mem.defer(lambda: torch.zeros(2), on_gpu=True)
        before = SyncedMemory.device_heads
        mem.gpu_data()  # the deferred value is written to the device side
        return before

    def host_then_mutable_device(mem):
        mem.mutable_cpu_data()
        before = SyncedMemory.device_heads
        mem.mutable_gpu_data()  # synced first (not a move), then the device side alone
        return before

    return {
        "head setter": lambda m: setattr(m, "head", Head.HEAD_AT_GPU),
        "defer on the device": lambda m: m.defer(lambda: torch.zeros(2), on_gpu=True),
        "drop_deferred": deferred_then_dropped,
        "deferred write": deferred_then_written,
        "first gpu_data": lambda m: [m.gpu_data()] and None,
        "mutable_gpu_data": host_then_mutable_device,
        "set_gpu_data": lambda m: m.set_gpu_data(torch.zeros(2)),
        "take on the device": lambda m: [m.take(torch.zeros(2, device="meta"))] and None,
    }


@pytest.mark.parametrize("op", list(_to_device_side_ops()))
def test_every_move_to_the_device_side_is_counted(op):
    """``device_heads`` lets a reader of the host sides skip looking while it stays the
    same: each way a head becomes HEAD_AT_GPU must count."""
    mem = SyncedMemory(2, gpu_device="meta" if op == "take on the device" else "cpu")
    before = SyncedMemory.device_heads
    since = _to_device_side_ops()[op](mem)  # None, or the count before the last step
    assert mem.head is Head.HEAD_AT_GPU
    assert SyncedMemory.device_heads > (before if since is None else since)


def _to_host_side_ops():
    def deferred_then_dropped(mem):
        mem.mutable_cpu_data()
        mem.defer(lambda: torch.zeros(2), on_gpu=True)
        before = SyncedMemory.watched_host_heads
        mem.drop_deferred()  # back to the host side
        return before

    def deferred_then_written(mem):
        mem.defer(lambda: torch.zeros(2))
        before = SyncedMemory.watched_host_heads
        mem.cpu_data()  # the deferred value is written to the host side
        return before

    def device_then_mutable_host(mem):
        mem.mutable_gpu_data()
        before = SyncedMemory.watched_host_heads
        mem.mutable_cpu_data()  # synced first (not a move), then the host side alone
        return before

    return {
        "head setter": lambda m: setattr(m, "head", Head.HEAD_AT_CPU),
        "defer on the host": lambda m: m.defer(lambda: torch.zeros(2)),
        "drop_deferred": deferred_then_dropped,
        "deferred write": deferred_then_written,
        "first cpu_data": lambda m: [m.cpu_data()] and None,
        "mutable_cpu_data": device_then_mutable_host,
        "set_cpu_data": lambda m: m.set_cpu_data(torch.zeros(2)),
        "take on the host": lambda m: [m.take(torch.zeros(2))] and None,
    }


@pytest.mark.parametrize("op", list(_to_host_side_ops()))
def test_every_move_of_a_watched_memory_to_the_host_side_is_counted(op):
    """``watched_host_heads`` lets a GPU-mode reader of its params' device sides skip looking
    while it stays the same: each way a watched head becomes HEAD_AT_CPU must count, and an
    unwatched memory (an input a script writes each run) must not."""
    watched, unwatched = (SyncedMemory(2, gpu_device="cpu") for _ in range(2))
    watched.watched = True
    before = SyncedMemory.watched_host_heads
    _to_host_side_ops()[op](unwatched)
    assert unwatched.head is Head.HEAD_AT_CPU
    assert SyncedMemory.watched_host_heads == before
    since = _to_host_side_ops()[op](watched)  # None, or the count before the last step
    assert watched.head is Head.HEAD_AT_CPU
    assert SyncedMemory.watched_host_heads > (before if since is None else since)


@pytest.mark.parametrize(
    "swap",
    ["reshape larger", "set_cpu_data of a new size", "share_data", "share_diff"],
)
def test_a_watched_memory_leaving_its_blob_is_counted(swap):
    """A param blob given new memory: its watcher must look at the new one, which nobody
    watches yet."""
    blob, other = Blob((2,)), Blob((2,))
    watch_memories([blob])
    before = SyncedMemory.watched_host_heads
    if swap == "reshape larger":
        blob.reshape(3)
    elif swap == "set_cpu_data of a new size":
        blob.reshape(1)  # capacity kept: the memory's count is 2
        blob.set_cpu_data(torch.zeros(1))
    else:
        getattr(blob, swap)(other)
    assert SyncedMemory.watched_host_heads == before + 1
    moved = SyncedMemory.watched_host_heads
    other.reshape(5)  # nothing watched leaves
    assert SyncedMemory.watched_host_heads == moved


def test_host_side_work_leaves_the_device_count():
    mem = SyncedMemory(2, gpu_device="cpu")
    mem.mutable_gpu_data()
    before = SyncedMemory.device_heads
    mem.cpu_data()
    mem.mutable_cpu_data()
    mem.defer(lambda: torch.ones(2))
    mem.set_cpu_data(torch.zeros(2))
    mem.take(torch.ones(2))
    mem.release()
    assert SyncedMemory.device_heads == before


def test_a_side_first_read_inside_inference_mode_stays_writable():
    """A buffer made while a forward read it under inference_mode was an inference tensor,
    and the next in-place write outside (a deferred top, ``data[...] = x``) raised."""
    mem = SyncedMemory(4)
    with torch.inference_mode():
        mem.cpu_data()
    mem.defer(lambda: torch.ones(4))
    assert mem.cpu_data().tolist() == [1.0] * 4
    mem.mutable_cpu_data()[:] = 2


@pytest.mark.parametrize(
    "layer, want", [('type: "ReLU"', 1.0), ('type: "Power" power_param { shift: 1 }', 2.0)]
)
def test_caffe_face_in_place_layer_on_an_input_never_written(layer, want):
    import torchcaffe as caffe

    net = caffe.Net(
        f'input: "a" input_shape {{ dim: 2 dim: 3 }} '
        f'layer {{ name: "l" {layer} bottom: "a" top: "a" }}',
        caffe.TEST,
    )
    assert net.forward()["a"].tolist() == [[want - 1.0] * 3] * 2
    net.blobs["a"].data[...] = 1
    assert net.forward()["a"].tolist() == [[want] * 3] * 2
