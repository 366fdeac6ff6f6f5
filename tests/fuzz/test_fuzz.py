"""Fuzz every format torchcaffe reads (issue 13): prototxt text, binary NetParameter,
caffemodel (binary and HDF5), solverstate (binary and HDF5), binaryproto and Datum bytes.

Every case must end in success or a ``TorchCaffeError`` subclass, within the time and memory
bounds of ``engine.bounded``/``engine.memory_cap``; a success must equal the reference decoder
(protobuf's own parser, or h5py for HDF5) and, for binary weights and states, a reference
refusal and ours must agree. HDF5 files are also damaged byte by byte in place (bit flips,
zeroed and overwritten runs, truncation); refusals of weights and states must name the file,
and a refused weights load must leave every param as it was. 2,000 cases per format in CI;
``TORCHCAFFE_FUZZ=long`` runs 50,000. Cases are seeded: ``engine.rng_for(format, case)``
rebuilds any one of them.
"""

from __future__ import annotations

import warnings

import h5py
import numpy as np
import pytest
import torch
from google.protobuf import text_format

import torchcaffe
from torchcaffe.data.datum import datum_to_array, parse_datum
from torchcaffe.formats.binaryproto import read_mean_file
from torchcaffe.formats.prototxt import read_net
from torchcaffe.proto import caffe_pb2
from torchcaffe.solver.state import SolverSnapshot, read_solverstate, write_solverstate_hdf5

from . import corpus, reference
from .engine import (
    INTERESTING_INTS,
    Mismatch,
    Tally,
    case_count,
    memory_cap,
    mutate_bytes,
    mutate_file_bytes,
    report,
    rng_for,
    run_case,
)

N = case_count()


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _equal(a, b, what: str) -> None:
    if a != b:
        raise Mismatch(f"{what}: ours {str(a)[:150]} != reference {str(b)[:150]}")


# -- prototxt text and binary NetParameter ----------------------------------------------------
def _reference_text(data: bytes) -> caffe_pb2.NetParameter | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None  # no reference: protobuf's Python parser takes only valid text
    try:
        return text_format.Parse(text, caffe_pb2.NetParameter())
    except text_format.ParseError:
        return caffe_pb2.NetParameter(name="<reference refused>")


def test_fuzz_prototxt_text(tmp_path):
    seeds = [t.encode() for t in corpus.NETS]
    tally = Tally("prototxt")
    path = tmp_path / "net.prototxt"
    with memory_cap():
        for i in range(N):
            rng = rng_for("prototxt", i)
            data, how = corpus.mutate_prototxt(rng, rng.choice(seeds), seeds)
            path.write_bytes(data)

            def check(net, data=data):
                ref = _reference_text(data)
                if ref is not None:
                    _equal(read_net(path, upgrade=False), ref, "parsed NetParameter")

            run_case(tally, i, how, lambda: torchcaffe.load(str(path)), check)
    report(tally)


def test_fuzz_binary_netparameter(tmp_path):
    seeds = [corpus.text_net(i).SerializeToString() for i in range(len(corpus.NETS))]
    seeds.append(caffe_pb2.SolverState(iter=3).SerializeToString())  # a wrong message
    tally = Tally("binary NetParameter")
    path = tmp_path / "net.protobin"
    with memory_cap():
        for i in range(N):
            rng = rng_for("binary NetParameter", i)
            data, how = mutate_bytes(rng, rng.choice(seeds), seeds)
            path.write_bytes(data)

            def check(net, data=data):
                try:
                    ref = caffe_pb2.NetParameter.FromString(data)
                except Exception as err:  # noqa: BLE001
                    raise Mismatch(f"protobuf refuses what we loaded: {err}") from None
                _equal(read_net(path, upgrade=False), ref, "parsed NetParameter")

            run_case(tally, i, how, lambda: torchcaffe.load(str(path)), check)
    report(tally)


# -- caffemodel -------------------------------------------------------------------------------
class Target:
    """The small net weights are loaded into, reset before every case."""

    def __init__(self) -> None:
        self.net = torchcaffe.load(corpus.NETS[0])
        self.start = {
            (s.name, j): b.detach().clone()
            for s in self.net.steps
            for j, b in enumerate(self.net.layer(s.name).param_blobs())
        }
        self.shapes = {
            s.name: [tuple(b.shape) for b in self.net.layer(s.name).param_blobs()]
            for s in self.net.steps
        }
        self.names = list(self.shapes)

    def reset(self) -> None:
        with torch.no_grad():
            for (name, j), value in self.start.items():
                self.net.layer(name).param_blobs()[j].copy_(value)

    def params(self) -> dict:
        return {
            (n, j): b.detach().numpy()
            for n in self.names
            for j, b in enumerate(self.net.layer(n).param_blobs())
        }


def _check_params(target: Target, copies: dict) -> None:
    got = target.params()
    for key, start in target.start.items():
        want = copies.get(key)
        want = start.numpy() if want is None else np.asarray(want, np.float32).reshape(start.shape)
        if not np.array_equal(got[key], want, equal_nan=True):
            raise Mismatch(f"param {key} differs from the reference copy")


def _caffemodel_seeds(target: Target, tmp_path) -> list[bytes]:
    full = tmp_path / "seed.caffemodel"
    torchcaffe.save_weights(target.net, full)
    v1 = caffe_pb2.NetParameter(name="small")
    for name in ("conv", "ip"):
        layer = v1.layers.add(name=name, type=caffe_pb2.V1LayerParameter.CONVOLUTION)
        for b in target.net.layer(name).param_blobs():
            layer.blobs.add().CopyFrom(corpus.blob_proto(b.detach().numpy(), legacy=True))
    return [full.read_bytes(), v1.SerializeToString()]


def test_fuzz_caffemodel_binary(tmp_path):
    target = Target()
    seeds = _caffemodel_seeds(target, tmp_path)
    others = seeds + [caffe_pb2.Datum(channels=1).SerializeToString()]
    tally = Tally("caffemodel")
    path = tmp_path / "m.caffemodel"
    with memory_cap():
        for i in range(N):
            rng = rng_for("caffemodel", i)
            base = rng.choice(seeds)
            if rng.random() < 0.5:
                msg = caffe_pb2.NetParameter.FromString(base)
                how = corpus.mutate_net_message(rng, msg, target.names)
                data = msg.SerializeToString()
                if rng.random() < 0.3:
                    data, more = mutate_bytes(rng, data, others)
                    how += "+" + more
            elif rng.random() < 0.2:
                data, how = corpus.rename_bytes(rng, base, ["conv", "ip"]), "non_utf8_name"
            else:
                data, how = mutate_bytes(rng, base, others)
            path.write_bytes(data)
            target.reset()

            def reference_copies(data=data):
                return reference.caffemodel_params(data, target.shapes)

            def accepts(ref=reference_copies):
                try:
                    ref()
                except reference.Reject:
                    return False
                return True

            def check(_, ref=reference_copies):
                try:
                    copies = ref()
                except reference.Reject as err:
                    raise Mismatch(f"loaded what the reference refuses ({err})") from None
                _check_params(target, copies)

            run_case(
                tally,
                i,
                how,
                lambda: torchcaffe.load_weights(target.net, path),
                check,
                accepts,
                names=str(path),
                after_refusal=lambda: _check_params(target, {}),
            )
    report(tally)


def _random_h5_weights(rng, path, target: Target) -> str:
    """An HDF5 weights file of random structure: kinds, dtypes, shapes (lazy huge ones too)."""
    hows = []
    with h5py.File(path, "w") as f:
        if rng.random() < 0.05:
            f.create_dataset("data", data=np.zeros(3))
            return "data_is_dataset"
        data = f.create_group("data")
        for name in rng.sample(target.names + ["other", "ip/x"], rng.randint(0, 4)):
            if name.split("/")[0] in data:
                continue  # one entry per layer (and "ip/x" nests below a group "ip")
            shapes = target.shapes.get(name) or [(3,)]
            if rng.random() < 0.05:
                data.create_dataset(name, data=np.zeros(2))
                hows.append("layer_is_dataset")
                continue
            group = data.require_group(name)
            count = len(shapes) + rng.choice((0, 0, 0, -1, 1))
            for j in range(max(count, 0)):
                shape = shapes[j] if j < len(shapes) else (2,)
                kind = rng.randrange(10)
                key = str(j) if rng.random() > 0.05 else rng.choice(("x", "7", "-1"))
                if key in group:
                    continue
                if kind == 0:
                    group.create_group(key)
                    hows.append("blob_is_group")
                elif kind == 1:
                    group.create_dataset(key, shape=(10**6, 4096), dtype="f4")
                    hows.append("lazy_huge")
                elif kind == 2:
                    group.create_dataset(key, data=np.array([b"ab"] * max(1, int(np.prod(shape)))))
                    hows.append("string")
                elif kind == 3:
                    group.create_dataset(key, shape=shape, dtype=[("a", "f4"), ("b", "i2")])
                    hows.append("compound")
                elif kind == 4:
                    legacy = (1,) * (4 - len(shape)) + tuple(shape)
                    group.create_dataset(key, data=np.ones(legacy, np.float32))
                    hows.append("legacy_4d")
                elif kind == 5:
                    group.create_dataset(key, data=np.ones(shape[::-1], np.float32))
                    hows.append("transposed")
                elif kind == 6:
                    group.create_dataset(key, data=np.int16(rng.choice(INTERESTING_INTS) % 1000))
                    hows.append("scalar")
                else:
                    dtype = rng.choice(("f4", "f8", "i4", "u1", "f2"))
                    values = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
                    group.create_dataset(key, data=values)
                    hows.append(dtype)
    return "+".join(hows) or "empty"


def test_fuzz_caffemodel_hdf5(tmp_path):
    target = Target()
    seed_path = tmp_path / "seed.caffemodel.h5"
    torchcaffe.save_weights(target.net, seed_path)
    seed = seed_path.read_bytes()
    tally = Tally("caffemodel HDF5")
    with memory_cap():
        for i in range(N):
            rng = rng_for("caffemodel HDF5", i)
            # one file name per case: HDF5 keeps a file it still has open by inode, and a
            # rewritten path must not meet an earlier case's cached metadata
            path = tmp_path / f"m{i}.caffemodel.h5"
            how = _h5_case(rng, path, seed, lambda r, p: _random_h5_weights(r, p, target))
            target.reset()

            def check(_, path=path):
                if path.read_bytes()[:8] != b"\x89HDF\r\n\x1a\n":  # no signature: Caffe's
                    # H5Fis_hdf5 says no and it reads the bytes as a binary model
                    try:
                        copies = reference.caffemodel_params(path.read_bytes(), target.shapes)
                    except reference.Reject as err:
                        raise Mismatch(f"loaded what the reference refuses ({err})") from None
                    _check_params(target, copies)
                    return
                with h5py.File(path, "r") as f:
                    copies = {}
                    for name in target.names:
                        group = f["data"].get(name)
                        for j in range(len(target.shapes[name])):
                            if group is not None and str(j) in group:
                                copies[(name, j)] = group[str(j)][()]
                _check_params(target, copies)

            run_case(
                tally,
                i,
                how,
                lambda path=path: torchcaffe.load_weights(target.net, path),
                check,
                names=str(path),
                after_refusal=lambda: _check_params(target, {}),  # all or nothing
            )
            path.unlink()
    report(tally)


def _h5_case(rng, path, seed: bytes, structure) -> str:
    """Write one HDF5 case: a file of random structure (``structure(rng, path)``), a damaged
    copy of the well-formed ``seed`` (bit flips, zeroed or overwritten bytes, truncation),
    or a random structure damaged the same way."""
    roll = rng.random()
    if roll < 0.6:
        return structure(rng, path)
    if roll < 0.9:
        data, how = mutate_file_bytes(rng, seed)
    else:
        how = structure(rng, path) + "+"
        data, more = mutate_file_bytes(rng, path.read_bytes())
        how += more
    path.write_bytes(data)
    return how


# -- solver states ----------------------------------------------------------------------------
SHAPES = [(4, 3, 3, 3), (4,), (5, 48), (5,)]


def test_fuzz_solverstate_binary(tmp_path):
    good = caffe_pb2.SolverState(iter=7, current_step=1, learned_net="m.caffemodel")
    for shape in SHAPES:
        good.history.add().CopyFrom(
            corpus.blob_proto(np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape))
        )
    seeds = [good.SerializeToString()]
    others = seeds + [corpus.text_net(0).SerializeToString()]
    tally = Tally("solverstate")
    path = tmp_path / "s.solverstate"
    with memory_cap():
        for i in range(N):
            rng = rng_for("solverstate", i)
            if rng.random() < 0.5:
                msg = caffe_pb2.SolverState.FromString(seeds[0])
                op = rng.randrange(5)
                if op <= 2:
                    how = corpus.mutate_blob(rng, msg.history[rng.randrange(len(msg.history))])
                elif op == 3:
                    del msg.history[rng.randrange(len(msg.history))]
                    how = "drop_history"
                else:
                    msg.iter = corpus._int32(rng.choice(INTERESTING_INTS))
                    how = "iter"
                data = msg.SerializeToString()
            else:
                data, how = mutate_bytes(rng, seeds[0], others)
            path.write_bytes(data)

            def ref(data=data):
                return reference.solverstate(data, SHAPES)

            def accepts(ref=ref):
                try:
                    ref()
                except reference.Reject:
                    return False
                return True

            def check(snap, ref=ref):
                try:
                    it, step, learned, history = ref()
                except reference.Reject as err:
                    raise Mismatch(f"loaded what the reference refuses ({err})") from None
                _equal((snap.iter, snap.current_step, snap.learned_net), (it, step, learned), "")
                for j, (a, b) in enumerate(zip(snap.history, history)):
                    if not np.array_equal(np.asarray(a).ravel(), b, equal_nan=True):
                        raise Mismatch(f"history {j} differs")

            run_case(
                tally,
                i,
                how,
                lambda: read_solverstate(path, expected_shapes=SHAPES),
                check,
                accepts,
                names=str(path),
            )
    report(tally)


def _random_h5_state(rng, path) -> str:
    hows = []
    with h5py.File(path, "w") as f:
        for key in ("iter", "current_step", "learned_net"):
            kind = rng.randrange(24)  # 0-4 malformed, the rest well formed
            if kind == 0:
                hows.append(f"{key}_missing")
            elif kind == 1:
                f.create_dataset(key, data=np.bytes_("12"))
                hows.append(f"{key}_string")
            elif kind == 2:
                f.create_dataset(key, data=np.float64(rng.choice((1e300, np.nan, 3.5, -2.0))))
                hows.append(f"{key}_float")
            elif kind == 3:
                f.create_group(key)
                hows.append(f"{key}_group")
            elif kind == 4:
                f.create_dataset(key, data=np.arange(3))
                hows.append(f"{key}_array")
            elif key == "learned_net":
                f.create_dataset(key, data=np.bytes_("m.caffemodel.h5"))
            else:
                f.create_dataset(key, data=np.int32(rng.choice(INTERESTING_INTS) % 2**31))
        if rng.random() < 0.1:
            f.create_dataset("history", data=np.zeros(2))
            return "+".join(hows + ["history_dataset"])
        group = f.create_group("history")
        keys = [str(j) for j in range(len(SHAPES) + rng.choice((0, 0, 0, -1, 1)))]
        if rng.random() < 0.1 and keys:
            keys[rng.randrange(len(keys))] = rng.choice(("9", "x", "-1"))
            hows.append("keys")
        for j, key in enumerate(keys):
            shape = SHAPES[j] if j < len(SHAPES) else (3,)
            kind = rng.randrange(24)  # 0-3 malformed
            if kind == 0:
                group.create_group(key)
                hows.append("history_group")
            elif kind == 1:
                group.create_dataset(key, shape=(10**6, 4096), dtype="f4")
                hows.append("lazy_huge")
            elif kind == 2:
                group.create_dataset(key, data=np.array([b"x"] * int(np.prod(shape))))
                hows.append("string")
            elif kind == 3:
                group.create_dataset(key, data=np.ones(shape[::-1], np.float32))
                hows.append("transposed")
            else:
                group.create_dataset(key, data=np.ones(shape, rng.choice(("f4", "f8", "i2"))))
    return "+".join(hows) or "valid"


def test_fuzz_solverstate_hdf5(tmp_path):
    seed_path = tmp_path / "seed.solverstate.h5"
    write_solverstate_hdf5(
        seed_path, SolverSnapshot(3, 1, "m.caffemodel.h5", [np.ones(s) for s in SHAPES])
    )
    seed = seed_path.read_bytes()
    tally = Tally("solverstate HDF5")
    with memory_cap():
        for i in range(N):
            rng = rng_for("solverstate HDF5", i)
            path = tmp_path / f"s{i}.solverstate.h5"  # one name per case (see caffemodel)
            how = _h5_case(rng, path, seed, _random_h5_state)

            def check(snap, path=path):
                with h5py.File(path, "r") as f:
                    for key in ("iter", "current_step"):  # scalar or Caffe's [1] array
                        want = int(np.asarray(f[key][()]).reshape(-1)[0])
                        _equal(getattr(snap, key), want, key)
                    for j, h in enumerate(snap.history):
                        want = np.asarray(f["history"][str(j)][()], np.float32)
                        if not np.array_equal(h, want, equal_nan=True) or h.shape != SHAPES[j]:
                            raise Mismatch(f"history {j} differs")

            run_case(
                tally,
                i,
                how,
                lambda path=path: read_solverstate(path, expected_shapes=SHAPES),
                check,
                names=str(path),
            )
            path.unlink()
    report(tally)


# -- binaryproto and Datum --------------------------------------------------------------------
def test_fuzz_binaryproto(tmp_path):
    arr = np.arange(60, dtype=np.float32).reshape(1, 3, 4, 5)
    seeds = [
        corpus.blob_proto(arr).SerializeToString(),
        corpus.blob_proto(arr, legacy=True).SerializeToString(),
        corpus.blob_proto(arr[0].astype(np.float64), double=True).SerializeToString(),
    ]
    others = seeds + [caffe_pb2.Datum(channels=3).SerializeToString()]
    tally = Tally("binaryproto")
    path = tmp_path / "mean.binaryproto"
    with memory_cap():
        for i in range(N):
            rng = rng_for("binaryproto", i)
            base = rng.choice(seeds)
            if rng.random() < 0.4:
                msg = caffe_pb2.BlobProto.FromString(base)
                how = corpus.mutate_blob(rng, msg)
                data = msg.SerializeToString()
            else:
                data, how = mutate_bytes(rng, base, others)
            path.write_bytes(data)

            def ref(data=data):
                return reference.blob_proto_array(data)

            def accepts(ref=ref):
                try:
                    ref()
                except reference.Reject:
                    return False
                return True

            def check(got, ref=ref):
                try:
                    want = ref()
                except reference.Reject as err:
                    raise Mismatch(f"loaded what the reference refuses ({err})") from None
                if got.shape != want.shape or not np.array_equal(got, want, equal_nan=True):
                    raise Mismatch("array differs")

            run_case(tally, i, how, lambda: read_mean_file(path), check, accepts)
    report(tally)


def test_fuzz_datum_bytes():
    seeds = [
        caffe_pb2.Datum(channels=3, height=4, width=5, data=bytes(range(60)), label=2),
        caffe_pb2.Datum(channels=2, height=3, width=1, float_data=[0.5] * 6),
        caffe_pb2.Datum(channels=1, height=2, width=2, data=b"\x89PNG", encoded=True),
    ]
    seeds_b = [d.SerializeToString() for d in seeds]
    tally = Tally("Datum")

    def read(data: bytes):  # the reader behind the Data layers (encoded ones go to OpenCV)
        return datum_to_array(parse_datum(data, source="fuzz"), source="fuzz")

    with memory_cap():
        for i in range(N):
            rng = rng_for("Datum", i)
            if rng.random() < 0.4:
                msg = caffe_pb2.Datum()
                msg.CopyFrom(rng.choice(seeds))
                field = rng.choice(("channels", "height", "width"))
                setattr(msg, field, corpus._int32(rng.choice(INTERESTING_INTS)))
                if rng.random() < 0.3:
                    msg.data = msg.data[: rng.randrange(len(msg.data) + 1)]
                data, how = msg.SerializeToString(), field
            else:
                data, how = mutate_bytes(rng, rng.choice(seeds_b), seeds_b)

            def check(got, data=data):
                try:
                    want = reference.datum_array(data)
                except reference.Reject as err:
                    raise Mismatch(f"read what the reference refuses ({err})") from None
                if got.shape != want.shape or not np.array_equal(got, want, equal_nan=True):
                    raise Mismatch("array differs")

            run_case(tally, i, how, lambda data=data: read(data), check)
    report(tally)
