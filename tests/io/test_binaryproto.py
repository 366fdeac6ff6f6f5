"""BlobProto <-> numpy (Caffe's Blob::FromProto/ToProto rules) and blob files, mean files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from torchcaffe.errors import DataError, PrototxtError
from torchcaffe.formats.binaryproto import (
    array_to_blob_proto,
    blob_proto_shape,
    blob_proto_to_array,
    read_blob_proto,
    read_blob_proto_vector,
    read_mean_file,
    write_blob_proto,
    write_blob_proto_vector,
)
from torchcaffe.proto import caffe_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
GOLDEN = (
    REPO / "tests" / "golden"
    if (REPO / "tests" / "golden").is_dir()
    else (REPO / ".." / "shared" / "golden").resolve()
)
MEAN_CASES = sorted(p.parent for p in (GOLDEN / "data").glob("*/mean.binaryproto"))


def arange(*shape: int, dtype=np.float32) -> np.ndarray:
    return (np.arange(np.prod(shape), dtype=np.float64) * 0.5 - 3).astype(dtype).reshape(shape)


# -- arrays <-> BlobProto ------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (7,), (2, 3, 4, 5, 6), ()])
def test_nd_round_trip(shape):
    arr = arange(*shape)
    proto = array_to_blob_proto(arr)
    assert list(proto.shape.dim) == list(shape)
    assert not any(proto.HasField(f) for f in ("num", "channels", "height", "width"))
    back = blob_proto_to_array(proto)
    assert back.dtype == np.float32 and back.shape == shape
    np.testing.assert_array_equal(back, arr)


def test_zero_axis_array_has_no_shape_field():
    """Blob::ToProto only touches ``shape`` to add a dim, so a 0-axis blob (a PReLU
    channel_shared slope's history in a .solverstate) is written without one."""
    proto = array_to_blob_proto(np.float32(0.25))
    assert not proto.HasField("shape")
    assert proto.SerializeToString() == b"*\x04\x00\x00\x80>"  # data only
    back = blob_proto_to_array(proto)
    assert back.shape == () and back == np.float32(0.25)


@pytest.mark.parametrize(
    "shape,legacy", [((2, 3, 4, 5), (2, 3, 4, 5)), ((4, 5), (1, 1, 4, 5)), ((6,), (1, 1, 1, 6))]
)
def test_legacy_4d_round_trip(shape, legacy):
    arr = arange(*shape)
    proto = array_to_blob_proto(arr, legacy_4d=True)
    assert (proto.num, proto.channels, proto.height, proto.width) == legacy
    assert len(proto.shape.dim) == 0
    np.testing.assert_array_equal(blob_proto_to_array(proto), arr.reshape(legacy))


def test_legacy_4d_refuses_five_axes():
    with pytest.raises(DataError, match="at most 4 axes"):
        array_to_blob_proto(arange(1, 2, 3, 4, 5), legacy_4d=True)


def test_legacy_fields_take_precedence_over_shape():
    proto = pb.BlobProto(num=1, channels=2, height=1, width=3)
    proto.shape.dim.append(6)
    proto.data.extend(range(6))
    assert blob_proto_shape(proto) == (1, 2, 1, 3)
    assert blob_proto_to_array(proto).shape == (1, 2, 1, 3)


def test_float64_round_trip_uses_double_data():
    arr = arange(2, 3, dtype=np.float64) + 1e-12
    proto = array_to_blob_proto(arr, diff=-arr)
    assert len(proto.double_data) == 6 and len(proto.data) == 0
    back = blob_proto_to_array(proto)
    assert back.dtype == np.float64
    np.testing.assert_array_equal(back, arr)
    np.testing.assert_array_equal(blob_proto_to_array(proto, diff=True), -arr)


def test_diff_round_trip():
    arr = arange(3, 2)
    proto = array_to_blob_proto(arr, diff=arr * 2)
    np.testing.assert_array_equal(blob_proto_to_array(proto, diff=True), arr * 2)


def test_double_data_is_preferred_over_data():
    proto = pb.BlobProto()
    proto.shape.dim.append(2)
    proto.data.extend([1, 2])
    proto.double_data.extend([3, 4])
    np.testing.assert_array_equal(blob_proto_to_array(proto), [3, 4])


def test_count_mismatch_raises():
    proto = pb.BlobProto()
    proto.shape.dim.extend([2, 3])
    proto.data.extend([1, 2, 3, 4, 5])
    with pytest.raises(DataError, match=r"m\.binaryproto: .*\[2, 3\].*expected 6 values, got 5"):
        blob_proto_to_array(proto, path="m.binaryproto")


def test_diff_shape_mismatch_raises():
    with pytest.raises(DataError, match="diff shape"):
        array_to_blob_proto(arange(2, 3), diff=arange(3, 2))


# -- files ---------------------------------------------------------------------------------


def test_blob_file_round_trip(tmp_path):
    path = tmp_path / "b.binaryproto"
    arr = arange(2, 3, 4, 5)
    write_blob_proto(arr, path)
    np.testing.assert_array_equal(read_mean_file(path), arr)
    proto = array_to_blob_proto(arr, legacy_4d=True)
    write_blob_proto(proto, path)
    assert read_blob_proto(path) == proto


def test_blob_vector_round_trip(tmp_path):
    path = tmp_path / "v.binaryproto"
    arrays = [arange(2, 3), arange(4)]
    write_blob_proto_vector(arrays, path)
    vector = read_blob_proto_vector(path)
    assert len(vector.blobs) == 2
    for blob, arr in zip(vector.blobs, arrays):
        np.testing.assert_array_equal(blob_proto_to_array(blob), arr)
    write_blob_proto_vector(vector, path)
    assert read_blob_proto_vector(path) == vector


def test_corrupt_blob_file_is_named(tmp_path):
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(array_to_blob_proto(arange(3, 4)).SerializeToString()[:-3])
    with pytest.raises(PrototxtError, match=rf"{path}: not a valid binary BlobProto"):
        read_mean_file(path)


def test_missing_mean_file_is_named(tmp_path):
    with pytest.raises(PrototxtError, match="absent.binaryproto: file not found"):
        read_mean_file(tmp_path / "absent.binaryproto")


def test_golden_mean_cases_exist():
    assert MEAN_CASES, f"no data/*/mean.binaryproto under {GOLDEN}"


@pytest.mark.parametrize("case", MEAN_CASES, ids=lambda p: p.name)
def test_golden_mean_file_matches_reference(case):
    mean = read_mean_file(case / "mean.binaryproto")
    arrays = np.load(case / "arrays.npz")
    assert "mean" in arrays.files, f"{case.name}: arrays.npz has no 'mean' array to compare with"
    assert mean.shape == arrays["mean"].shape
    np.testing.assert_array_equal(mean, arrays["mean"])
