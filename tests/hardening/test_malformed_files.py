"""Malformed HDF5 weights, solver states and BlobProto files end in a located error (issue 13,
finding 4 and the binaryproto part of finding 5): structure, dtype and shape are checked before
any value is read, and every message names the file and the entry."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import torchcaffe
from torchcaffe.errors import BlobWiringError, DataError, PrototxtError, SolverError, WeightsError
from torchcaffe.formats.binaryproto import read_mean_file
from torchcaffe.formats.prototxt import read_net, read_text_proto
from torchcaffe.proto import caffe_pb2
from torchcaffe.solver.state import SolverSnapshot, read_solverstate, write_solverstate_hdf5

from ..fuzz.engine import memory_cap

NET = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 48 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 5 } }
"""


def net():
    return torchcaffe.load(read_net(NET))


def h5(path, build) -> str:
    with h5py.File(path, "w") as f:
        build(f)
    return str(path)


def good_ip(f):
    g = f.create_group("data/ip")
    g.create_dataset("0", data=np.zeros((5, 48), np.float32))
    g.create_dataset("1", data=np.zeros(5, np.float32))


# -- HDF5 weights -----------------------------------------------------------------------------
BAD_WEIGHTS = {
    "data_is_dataset": (lambda f: f.create_dataset("data", data=np.zeros(3)), r"/data"),
    "layer_is_dataset": (
        lambda f: f.create_dataset("data/ip", data=np.zeros(3)),
        r"/data/ip.*not a group",
    ),
    "blob_is_group": (lambda f: f.create_group("data/ip/0"), r"/data/ip/0.*not a dataset"),
    "string_dtype": (
        lambda f: f.create_dataset("data/ip/0", data=np.array([b"abc"] * 240).reshape(5, 48)),
        r"/data/ip/0.*data type",
    ),
    "compound_dtype": (
        lambda f: f.create_dataset("data/ip/0", shape=(5, 48), dtype=[("a", "f4"), ("b", "i4")]),
        r"/data/ip/0.*data type",
    ),
    "no_data_group": (lambda f: f.create_group("weights"), r"no 'data' group"),
    "too_many_blobs": (
        lambda f: [f.create_dataset(f"data/ip/{i}", data=np.zeros(5)) for i in range(3)],
        r"layer 'ip'.*number of blobs",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_WEIGHTS))
def test_malformed_hdf5_weights_raise_weights_error(tmp_path, case):
    build, pattern = BAD_WEIGHTS[case]
    path = h5(tmp_path / "w.caffemodel.h5", build)
    with pytest.raises(WeightsError, match=pattern) as info:
        torchcaffe.load_weights(net(), path)
    assert path in str(info.value)


def test_hdf5_dataset_over_the_axes_limit(tmp_path):
    # HDF5 itself caps a dataspace at 32 axes (Caffe's kMaxBlobAxes); a lower limit applies too.
    def build(f):
        f.create_dataset("data/ip/0", shape=(1, 1, 5, 48), dtype="f4")

    path = h5(tmp_path / "w.caffemodel.h5", build)
    with torchcaffe.limits.override(max_axes=3):
        with pytest.raises(WeightsError, match=r"/data/ip/0.*4 axes.*max_axes"):
            torchcaffe.load_weights(net(), path)


def test_lazy_huge_hdf5_dataset_is_refused_before_reading(tmp_path):
    # 1M x 4096 float32 declared (16 GB), no storage written: a few KB on disk.
    def build(f):
        f.create_dataset("data/ip/0", shape=(1_000_000, 4096), dtype="f4")
        f.create_dataset("data/ip/1", data=np.zeros(5, np.float32))

    path = h5(tmp_path / "w.caffemodel.h5", build)
    assert (tmp_path / "w.caffemodel.h5").stat().st_size < 100_000
    n = net()
    with memory_cap(2**30):  # reading the dataset would need 16 GB
        with pytest.raises(WeightsError, match=r"/data/ip/0|layer 'ip'.*shape"):
            torchcaffe.load_weights(n, path)


def test_lazy_huge_dataset_of_a_layer_not_in_the_net_is_never_read(tmp_path):
    def build(f):
        good_ip(f)
        f.create_dataset("data/other/0", shape=(100_000, 4096), dtype="f4")

    path = h5(tmp_path / "w.caffemodel.h5", build)
    assert torchcaffe.load_weights(net(), path) == ["ip"]


def test_truncated_hdf5_weights(tmp_path):
    path = h5(tmp_path / "w.caffemodel.h5", good_ip)
    raw = (tmp_path / "w.caffemodel.h5").read_bytes()
    (tmp_path / "w.caffemodel.h5").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(WeightsError, match="w.caffemodel.h5"):
        torchcaffe.load_weights(net(), path)


def test_integer_hdf5_weights_are_read_as_caffe_does(tmp_path):
    # Caffe's hdf5_load_nd_dataset accepts H5T_INTEGER datasets and converts them.
    def build(f):
        g = f.create_group("data/ip")
        g.create_dataset("0", data=np.arange(240, dtype=np.int32).reshape(5, 48))
        g.create_dataset("1", data=np.ones(5, np.int64))

    n = net()
    torchcaffe.load_weights(n, h5(tmp_path / "w.caffemodel.h5", build))
    assert n.layer("ip").weight[4, 47].item() == 239.0


# -- solver states ----------------------------------------------------------------------------
SHAPES = [(5, 48), (5,)]


def good_state(f):
    f.create_dataset("iter", data=np.int32(3))
    f.create_dataset("current_step", data=np.int32(0))
    g = f.create_group("history")
    g.create_dataset("0", data=np.zeros((5, 48), np.float32))
    g.create_dataset("1", data=np.zeros(5, np.float32))


def _mutate(change):
    def build(f):
        good_state(f)
        change(f)

    return build


def _replace(key, **kw):
    def change(f):
        del f[key]
        f.create_dataset(key, **kw)

    return change


BAD_STATES = {
    "history_is_dataset": (_replace("history", data=np.zeros(3)), r"/history.*not a group"),
    "history_keys_not_0_n": (
        lambda f: f["history"].move("1", "7"),
        r"/history datasets must be named 0..n-1",
    ),
    "history_entry_is_group": (
        lambda f: (f["history"].__delitem__("1"), f["history"].create_group("1")),
        r"/history/1 is not a dataset",
    ),
    "history_string_dtype": (
        _replace("history/1", data=np.array([b"x"] * 5)),
        r"/history/1.*data type",
    ),
    "iter_is_string": (_replace("iter", data=np.bytes_("12")), r"/iter is not a single number"),
    "iter_missing": (lambda f: f.__delitem__("iter"), r"no 'iter'"),
    "iter_huge": (_replace("iter", data=np.float64(1e300)), r"/iter is out of range"),
    "learned_net_is_number": (
        lambda f: f.create_dataset("learned_net", data=np.int32(4)),
        r"/learned_net is not a string",
    ),
    "history_wrong_shape": (
        _replace("history/0", data=np.zeros((1, 1, 5, 48), np.float32)),
        r"history blob 0.*shape mismatch",
    ),
    "history_lazy_huge": (
        _replace("history/0", shape=(1_000_000, 4096), dtype="f4"),
        r"/history/0.*elements, more than the limit",
    ),
    "history_count": (
        lambda f: f["history"].create_dataset("2", data=np.zeros(5)),
        r"number of history blobs",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_STATES))
def test_malformed_hdf5_solverstate_raises_solver_error(tmp_path, case):
    change, pattern = BAD_STATES[case]
    path = h5(tmp_path / "s.solverstate.h5", _mutate(change))
    with memory_cap(2**30), pytest.raises(SolverError, match=pattern) as info:
        read_solverstate(path, expected_shapes=SHAPES)
    assert path in str(info.value)


def test_good_hdf5_solverstate_reads(tmp_path):
    path = tmp_path / "s.solverstate.h5"
    write_solverstate_hdf5(
        path, SolverSnapshot(3, 1, "m.caffemodel.h5", [np.ones(s) for s in SHAPES])
    )
    snap = read_solverstate(path, expected_shapes=SHAPES)
    assert (snap.iter, snap.current_step, snap.learned_net) == (3, 1, "m.caffemodel.h5")


def _binary_state(tmp_path, blob: caffe_pb2.BlobProto) -> str:
    state = caffe_pb2.SolverState(iter=1)
    state.history.add().CopyFrom(blob)
    bias = state.history.add()
    bias.shape.dim.append(5)
    bias.data.extend([0.0] * 5)
    path = tmp_path / "s.solverstate"
    path.write_bytes(state.SerializeToString())
    return str(path)


def test_binary_history_legacy_dims_must_match_from_the_end(tmp_path):
    blob = caffe_pb2.BlobProto(num=1, channels=1, height=48, width=5)
    blob.data.extend([0.0] * 240)
    path = _binary_state(tmp_path, blob)
    with pytest.raises(SolverError, match=r"history blob 0.*shape mismatch"):
        read_solverstate(path, expected_shapes=SHAPES)
    blob.height, blob.width = 5, 48
    path = _binary_state(tmp_path, blob)
    assert read_solverstate(path, expected_shapes=SHAPES).history[0].size == 240


def test_binary_solverstate_garbage_is_a_solver_error(tmp_path):
    path = tmp_path / "s.solverstate"
    path.write_bytes(b"\x0a\xff\xff\xff\x0f")
    with pytest.raises(SolverError, match="s.solverstate"):
        read_solverstate(path)


# -- binaryproto ------------------------------------------------------------------------------
def test_binaryproto_dims_past_2_64_do_not_wrap(tmp_path):
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([2**32, 2**32, 1])  # product 2^64: wraps to 0 in int64 arithmetic
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(blob.SerializeToString())
    with pytest.raises(DataError, match=r"mean.binaryproto.*elements"):
        read_mean_file(path)


def test_binaryproto_with_too_many_axes(tmp_path):
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([1] * 33)
    blob.data.append(1.0)
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(blob.SerializeToString())
    with pytest.raises(DataError, match="33 axes"):
        read_mean_file(path)


def test_hdf5_param_after_a_missing_index_is_still_read(tmp_path):
    # Caffe opens "0".."n-1": a missing "1" is an error for an unshared param, whatever follows
    def build(f):
        g = f.create_group("data/ip")
        g.create_dataset("0", data=np.zeros((5, 48), np.float32))
        g.create_dataset("999999999", data=np.zeros(1, np.float32))

    with pytest.raises(WeightsError, match=r"layer 'ip'.*param 1 is missing"):
        torchcaffe.load_weights(net(), h5(tmp_path / "w.caffemodel.h5", build))


def test_lazy_huge_hdf5data_dataset_is_refused_before_reading(tmp_path):
    """An HDF5Data source is checked as Caffe's hdf5_load_nd_dataset reshapes a Blob to it
    (over INT_MAX elements: refused) before any of it is read: a few KB on disk can declare
    1M x 4096 floats (16 GB)."""
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("data", shape=(1_000_000, 4096), dtype="f4")
        f.create_dataset("label", data=np.zeros(1_000_000, np.float32))
    (tmp_path / "list.txt").write_text(f"{tmp_path / 'd.h5'}\n")
    proto = tmp_path / "net.prototxt"
    proto.write_text(
        'layer { name: "d" type: "HDF5Data" top: "data" top: "label" '
        f'hdf5_data_param {{ source: "{tmp_path / "list.txt"}" batch_size: 2 }} }}'
    )
    with memory_cap(2**30), pytest.raises(DataError, match=r"dataset 'data'.*max_blob"):
        torchcaffe.load(proto, phase="train")()


def test_a_binary_file_given_as_text_is_named_binary_not_quoted(tmp_path):
    """A solverstate passed where a text solver goes: the message says binary, one clean line
    (protobuf's own message would quote the raw bytes, control characters and all)."""
    state = caffe_pb2.SolverState(iter=3, learned_net="/m/x_iter_3.caffemodel")
    state.history.add().data.extend([0.5, -2.0])
    path = tmp_path / "x_iter_3.solverstate"
    path.write_bytes(state.SerializeToString())
    with pytest.raises(PrototxtError, match="binary data") as info:
        read_text_proto(path, caffe_pb2.SolverParameter)
    assert str(info.value).isprintable()


def test_control_characters_in_a_text_parse_error_are_escaped(tmp_path):
    path = tmp_path / "solver.prototxt"
    path.write_bytes(b'net: "n.prototxt"\nbase_lr: \x1b[31m\xff0.1\n')
    with pytest.raises(PrototxtError) as info:
        read_text_proto(path, caffe_pb2.SolverParameter)
    assert info.value.line == 2
    assert str(info.value).isprintable() and "\\x1b" in str(info.value)


@pytest.mark.parametrize("count", [5, 7])
def test_blobproto_and_datum_whose_data_does_not_fit_say_both_counts(count):
    """Still a ValueError, as pycaffe's numpy reshape raises, but one that says what fits."""
    from torchcaffe import io as caffe_io
    from torchcaffe.errors import ArrayShapeError

    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([2, 3])
    blob.data.extend([1.0] * count)
    with pytest.raises(ArrayShapeError, match=f"expected 6 values, got {count} values"):
        caffe_io.blobproto_to_array(blob)
    datum = caffe_pb2.Datum(channels=3, height=1, width=2, data=b"\0" * count)
    with pytest.raises(ValueError, match=f"Datum .* got {count} values"):
        caffe_io.datum_to_array(datum)


def test_a_caffemodel_given_as_the_net_says_so(tmp_path):
    """A caffemodel parses as a (binary) net, but its data layers hold no record: the wiring
    error it meets says the file is weights, and where they go."""
    text = (
        'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 } } }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
        "inner_product_param { num_output: 2 } }\n"
    )
    weights = tmp_path / "w_iter_10.caffemodel"
    torchcaffe.save_weights(torchcaffe.load(read_net(text)), weights)
    model = caffe_pb2.NetParameter.FromString(weights.read_bytes())
    del model.layer[0]  # as Caffe's snapshot of a net its data layer fed
    weights.write_bytes(model.SerializeToString())
    with pytest.raises(BlobWiringError, match=r"unknown bottom blob 'x'.*holds trained weights"):
        torchcaffe.load(weights)
