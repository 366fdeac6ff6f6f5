"""Blob: shape API, legacy accessors, reshape capacity, sharing, math and proto round trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchcaffe.blob import Blob, BlobShapeError, memories_at
from torchcaffe.proto import caffe_pb2
from torchcaffe.syncedmem import Head


def test_shape_count_and_legacy_accessors():
    b = Blob((2, 3, 4, 5))
    assert b.shape == (2, 3, 4, 5) and b.num_axes == 4
    assert b.count() == 120 and b.count(1) == 60 and b.count(1, 3) == 12
    assert (b.num, b.channels, b.height, b.width) == (2, 3, 4, 5)
    v = Blob((6, 7))  # legacy accessors pad on the left? no: missing trailing axes read as 1
    assert (v.num, v.channels, v.height, v.width) == (6, 7, 1, 1)


def test_canonical_axis_index_and_errors():
    b = Blob((2, 3, 4))
    assert b.canonical_axis_index(-1) == 2 and b.canonical_axis_index(0) == 0
    with pytest.raises(BlobShapeError, match="axis 3 out of range"):
        b.canonical_axis_index(3)
    with pytest.raises(BlobShapeError, match="at most 4 axes"):
        _ = Blob((1, 2, 3, 4, 5)).num


def test_offset_nchw_and_index_list():
    b = Blob((2, 3, 4, 5))
    assert b.offset(1, 2, 3, 4) == ((1 * 3 + 2) * 4 + 3) * 5 + 4
    assert b.offset([1, 2]) == (1 * 3 + 2) * 20
    assert b.offset([1, 2, 3, 4]) == b.offset(1, 2, 3, 4)
    with pytest.raises(BlobShapeError):
        b.offset([2, 0])


def test_reshape_refuses_non_integer_dimensions():
    # pycaffe's Blob.reshape extracts C++ ints: a float (say h / 2 under Python 3) or a
    # string is a TypeError there, not a dimension truncated by int().
    b = Blob((2, 3))
    for dims in ((2, 2.7), (4.0, 3), ("3", 2)):
        with pytest.raises(TypeError, match="blob dimensions must be integers"):
            b.reshape(*dims)
        assert b.shape == (2, 3)
    b.reshape(np.int64(4), 2)
    assert b.shape == (4, 2)


def test_reshape_reallocates_only_when_growing():
    b = Blob((4, 5))
    b.data[...] = 1.0
    mem = b.data_memory
    b.reshape(2, 5)
    assert b.data_memory is mem and b.capacity == 20 and b.count() == 10
    b.reshape((4, 5))
    assert b.data_memory is mem
    b.reshape(5, 5)
    assert b.data_memory is not mem and b.capacity == 25
    with pytest.raises(BlobShapeError, match="negative"):
        b.reshape(-1, 2)


def test_data_and_diff_are_writable_numpy_views():
    b = Blob((2, 3))
    view = b.data
    view[...] = 5.0
    assert torch.equal(b.cpu_data(), torch.full((2, 3), 5.0))
    b.diff[0, 1] = 2.0
    assert b.cpu_diff()[0, 1] == 2.0


def test_update_asum_sumsq_scale():
    b = Blob((3,))
    b.data[...] = [1.0, -2.0, 3.0]
    b.diff[...] = [0.5, 0.5, -1.0]
    assert b.asum_data() == 6.0 and b.sumsq_data() == 14.0
    assert b.asum_diff() == 2.0 and b.sumsq_diff() == 1.5
    b.update()
    np.testing.assert_array_equal(b.data, [0.5, -2.5, 4.0])
    b.scale_data(2.0)
    b.scale_diff(-1.0)
    np.testing.assert_array_equal(b.data, [1.0, -5.0, 8.0])
    np.testing.assert_array_equal(b.diff, [-0.5, -0.5, 1.0])


def test_share_data_and_diff():
    a, b = Blob((2, 2)), Blob((4,))
    b.share_data(a)
    a.data[...] = 3.0
    assert np.all(b.data == 3.0)
    b.share_diff(a)
    b.diff[...] = 1.0
    assert np.all(a.diff == 1.0)
    with pytest.raises(BlobShapeError, match="different counts"):
        Blob((3,)).share_data(a)


def test_growing_into_a_smaller_shared_memory_allocates():
    """A blob whose capacity is past the memory it shares (a Flatten top of a bottom that
    shrank) gets its own memory when it grows past that memory's count."""
    top, bottom = Blob((10,)), Blob((4,))
    top.reshape(4)
    top.share_data(bottom)
    top.reshape(6)  # within the top's capacity of 10, past the shared 4
    assert top.data.shape == (6,)
    assert not np.shares_memory(top.data, bottom.data)


def test_copy_from_with_and_without_reshape():
    src, dst = Blob((2, 3)), Blob((3, 2))
    src.data[...] = np.arange(6).reshape(2, 3)
    with pytest.raises(BlobShapeError, match="another shape"):
        dst.copy_from(src)
    dst.copy_from(src, reshape=True)
    np.testing.assert_array_equal(dst.data, src.data)
    src.diff[...] = 4.0
    dst.copy_from(src, copy_diff=True)
    assert np.all(dst.diff == 4.0)


def test_proto_round_trip_nd_and_diff():
    b = Blob((2, 3, 4))
    b.data[...] = np.random.default_rng(0).standard_normal((2, 3, 4))
    b.diff[...] = 0.25
    proto = b.to_proto(write_diff=True)
    assert list(proto.shape.dim) == [2, 3, 4] and len(proto.diff) == 24
    c = Blob()
    c.from_proto(proto)
    np.testing.assert_array_equal(c.data, b.data)
    np.testing.assert_array_equal(c.diff, b.diff)


def test_from_proto_legacy_4d_and_double_data():
    proto = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=3)
    proto.double_data.extend([1, 2, 3, 4, 5, 6])
    b = Blob()
    b.from_proto(proto)
    assert b.shape == (1, 2, 1, 3)
    np.testing.assert_array_equal(b.data.reshape(-1), [1, 2, 3, 4, 5, 6])
    target = Blob((2, 3))  # legacy shape (1,1,2,3) matches a (2,3) blob, as Caffe's ShapeEquals
    legacy = caffe_pb2.BlobProto(num=1, channels=1, height=2, width=3)
    legacy.data.extend(range(6))
    target.from_proto(legacy, reshape=False)
    with pytest.raises(BlobShapeError, match="shape mismatch"):
        Blob((3, 2)).from_proto(legacy, reshape=False)


def test_empty_versus_zero_axis_blob():
    # Caffe: a default Blob holds nothing; Reshape to an empty shape holds one scalar (loss tops).
    assert Blob().count == 0
    scalar = Blob(())
    assert scalar.count == 1 and scalar.shape == () and scalar.num_axes == 0
    scalar.diff[...] = 2.5
    assert float(scalar.diff) == 2.5


def test_blob_knows_whether_a_data_view_is_alive():
    b = Blob((2, 3))
    assert not b.has_live_views()
    b.data[...] = 1.0  # a temporary view
    assert not b.has_live_views()
    row = b.data[0]  # a view of the view keeps it alive
    assert b.has_live_views()
    del row
    assert not b.has_live_views()
    t = b.cpu_data()
    assert b.has_live_views()
    b.reshape(4, 5)  # grows: new memory, old views show the old buffer
    assert not b.has_live_views()
    del t


def test_before_write_runs_before_writable_data_only():
    b = Blob((2,))
    calls = []
    b.before_write = lambda: calls.append(1)
    b.cpu_data(), b.diff, b.cpu_diff()  # read-only data, or the diff
    assert calls == []
    b.data[...] = 1.0
    b.mutable_cpu_data()
    b.set_cpu_data(torch.zeros(2))
    assert calls == [1, 1, 1]


def test_memories_at_finds_each_side_with_that_head_and_follows_replaced_memories():
    """The Caffe face syncs the param memories this names before each run."""
    a, b = Blob((2,), gpu_device="cpu"), Blob((3,), gpu_device="cpu")
    a.mutable_gpu_data()  # a's data is current on the device side only
    b.mutable_gpu_diff()
    assert memories_at([a, b], Head.HEAD_AT_GPU) == [a.data_memory, b.diff_memory]
    assert memories_at([a, b], Head.UNINITIALIZED) == [a.diff_memory, b.data_memory]
    b.share_data(Blob((3,), gpu_device="cpu"))  # a memory replaced after the first scan
    b.data_memory.mutable_gpu_data()
    assert memories_at([b], Head.HEAD_AT_GPU) == [b.data_memory, b.diff_memory]
