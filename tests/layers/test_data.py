"""Data: LMDB/LevelDB records through Caffe's DataTransformer, in key order with wrap-around.

References are numpy ports of data_transformer.cpp's loops (crop at the offset, mean at the
crop offset, mirror flips output columns, ``(x - mean) * scale`` in float32).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import torchcaffe
from tests.helpers.cases import LayerCase
from tests.helpers.datasets import raw_lmdb
from tests.helpers.harness import make_layer
from torchcaffe.data.rng import CaffeRNG
from torchcaffe.errors import DataError, LayerParamError, UnsupportedError

RNG = np.random.default_rng(15)
ARRAYS = RNG.integers(0, 256, (6, 3, 8, 10), dtype=np.uint8)
LABELS = np.arange(6) % 4

_DIR = Path(tempfile.mkdtemp(prefix="torchcaffe-data-case-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
_DB = raw_lmdb(_DIR / "lmdb", ARRAYS, LABELS)

CASES = [
    # batch_size == records: every forward serves the same batch, so repeated runs agree.
    LayerCase(
        "Data",
        f'top: "data" top: "label" transform_param {{ crop_size: 6 mean_value: 100 scale: 0.5 }}'
        f' data_param {{ source: "{_DB}" batch_size: 6 backend: LMDB }}',
        bottom_shapes=(),
        n_tops=2,
        phase="TEST",
    ),
    LayerCase(
        "Data",
        f'top: "data" data_param {{ source: "{_DB}" batch_size: 6 backend: LMDB }}',
        bottom_shapes=(),
    ),
]


def data_layer(source, batch_size, transform="", phase="TEST", backend="LMDB", tops=2):
    top_text = " ".join(f'top: "{t}"' for t in ("data", "label")[:tops])
    snippet = (
        f"{top_text} transform_param {{ {transform} }} "
        f'data_param {{ source: "{source}" batch_size: {batch_size} backend: {backend} }}'
    )
    layer, _ = make_layer(snippet, (), type="Data", n_tops=tops, phase=phase)
    return layer


def ref_transform(x, *, crop=0, offset=(0, 0), mirror=False, mean=None, scale=1.0):
    """data_transformer.cpp's Datum loop, written out."""
    c, h, w = x.shape
    oh, ow = (crop, crop) if crop else (h, w)
    out = np.empty((c, oh, ow), np.float32)
    for ci in range(c):
        for hi in range(oh):
            for wi in range(ow):
                src = x[ci, offset[0] + hi, offset[1] + wi].astype(np.float32)
                top_w = ow - 1 - wi if mirror else wi
                if mean is None:
                    v = src
                elif np.ndim(mean) == 3:
                    v = src - np.float32(mean[ci, offset[0] + hi, offset[1] + wi])
                else:
                    v = src - np.float32(np.broadcast_to(mean, (c,))[ci])
                out[ci, hi, top_w] = v * np.float32(scale)
    return out


@pytest.mark.parametrize("batch_size,n_batches", [(4, 3), (6, 2), (5, 4), (1, 7)])
def test_key_order_wraps_and_test_crop_is_centred(batch_size, n_batches):
    layer = data_layer(
        _DB, batch_size, "crop_size: 5 mean_value: 10 mean_value: 20 mean_value: 30 scale: 0.25"
    )
    assert layer.output_shapes([]) == [(batch_size, 3, 5, 5), (batch_size,)]
    order = [i % 6 for i in range(batch_size * n_batches)]
    for b in range(n_batches):
        data, label = layer()
        rows = order[b * batch_size : (b + 1) * batch_size]
        want = np.stack(
            [
                ref_transform(
                    ARRAYS[r], crop=5, offset=(1, 2), mean=np.array([10, 20, 30]), scale=0.25
                )
                for r in rows
            ]
        )
        np.testing.assert_array_equal(data.numpy(), want)
        np.testing.assert_array_equal(label.numpy(), LABELS[rows])


def test_mean_file_is_read_at_the_crop_offset(tmp_path):
    mean = RNG.uniform(0, 255, (1, 3, 8, 10)).astype(np.float32)
    torchcaffe.formats.binaryproto.write_blob_proto(
        torchcaffe.formats.binaryproto.array_to_blob_proto(mean, legacy_4d=True),
        tmp_path / "mean.binaryproto",
    )
    layer = data_layer(_DB, 2, f'crop_size: 4 mean_file: "{tmp_path / "mean.binaryproto"}"')
    data, _ = layer()
    want = ref_transform(ARRAYS[0], crop=4, offset=(2, 3), mean=mean[0])
    np.testing.assert_array_equal(data.numpy()[0], want)


def test_a_mean_file_of_several_images_subtracts_the_first(tmp_path):
    """data_transformer.cpp checks the mean's channels, height and width only, and reads its
    first image."""
    mean = RNG.uniform(0, 255, (2, 3, 8, 10)).astype(np.float32)
    torchcaffe.formats.binaryproto.write_blob_proto(
        torchcaffe.formats.binaryproto.array_to_blob_proto(mean, legacy_4d=True),
        tmp_path / "mean.binaryproto",
    )
    layer = data_layer(_DB, 2, f'mean_file: "{tmp_path / "mean.binaryproto"}"')
    data, _ = layer()
    want = ref_transform(ARRAYS[0], crop=0, offset=(0, 0), mean=mean[0])
    np.testing.assert_array_equal(data.numpy()[0], want)


def test_train_mirror_and_crop_follow_caffes_draw_order():
    """do_mirror = Rand(2) first, then h_off, w_off: one mt19937 stream per transformer."""
    torch.manual_seed(7)
    layer = data_layer(_DB, 6, "mirror: true crop_size: 4", phase="TRAIN")
    seed = layer.loader.transformer.rng.seed
    data, _ = layer()
    rng = CaffeRNG(seed)
    for i in range(6):
        mirror = rng.rand(2) == 1
        off = (rng.rand(8 - 4 + 1), rng.rand(10 - 4 + 1))
        want = ref_transform(ARRAYS[i], crop=4, offset=off, mirror=mirror)
        np.testing.assert_array_equal(data.numpy()[i], want)
    torch.manual_seed(7)
    again = data_layer(_DB, 6, "mirror: true crop_size: 4", phase="TRAIN")
    np.testing.assert_array_equal(again()[0].numpy(), data.numpy())


def test_mirror_flips_in_test_too():
    torch.manual_seed(0)
    layer = data_layer(_DB, 6, "mirror: true")
    data, _ = layer()
    flipped = [np.array_equal(d, ARRAYS[i][:, :, ::-1]) for i, d in enumerate(data.numpy())]
    plain = [np.array_equal(d, ARRAYS[i]) for i, d in enumerate(data.numpy())]
    assert all(f or p for f, p in zip(flipped, plain)) and any(flipped)


def test_force_color_and_force_gray_together_refuse_only_encoded_datums(tmp_path):
    """Caffe's DataTransformer CHECKs the pair where it decodes an encoded datum; raw datums
    ignore both flags (Caffe logs it), so a net setting both reads them as without."""
    both = "force_color: true force_gray: true"
    want = data_layer(_DB, 6)()[0]
    torch.testing.assert_close(data_layer(_DB, 6, both)()[0], want, rtol=0, atol=0)
    from torchcaffe.data.cv import encode
    from torchcaffe.data.datum import encoded_datum
    from torchcaffe.data.db import DBWriter

    encoded = tmp_path / "encoded"
    with DBWriter(encoded, "lmdb") as db:
        png = encode(ARRAYS[0].transpose(1, 2, 0), "png", source="test")
        db.put(b"00000000", encoded_datum(png, 0).SerializeToString())
    with pytest.raises(DataError, match="cannot set both force_color and force_gray"):
        data_layer(encoded, 1, both)


def test_float_datums_and_single_top(tmp_path):
    arrays = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
    db = raw_lmdb(tmp_path / "f", arrays, [0, 1, 2])
    layer = data_layer(db, 3, "mean_value: 0.5 scale: 2", tops=1)
    np.testing.assert_allclose(layer().numpy(), (arrays - np.float32(0.5)) * 2, rtol=1e-6)


def test_shard_reads_every_world_size_th_record():
    layer = data_layer(_DB, 3, "", phase="TRAIN")
    layer.set_shard(1, 2)
    _, label = layer()
    np.testing.assert_array_equal(label.numpy(), LABELS[[1, 3, 5]])
    with pytest.raises(DataError, match="before the first forward"):
        layer.set_shard(0, 2)


def test_leveldb_backend(tmp_path):
    pytest.importorskip("plyvel")
    db = raw_lmdb(tmp_path / "ldb", ARRAYS, LABELS, backend="leveldb")
    layer = data_layer(db, 4, "", backend="LEVELDB")
    data, label = layer()
    np.testing.assert_array_equal(data.numpy(), ARRAYS[:4])


def test_leveldb_without_plyvel_names_the_extra(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "plyvel":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    (tmp_path / "ldb").mkdir()
    (tmp_path / "ldb" / "CURRENT").write_text("x")
    with pytest.raises(UnsupportedError, match=r"torchcaffe\[leveldb\]"):
        data_layer(tmp_path / "ldb", 2, "", backend="LEVELDB")


def _tree_state(path: Path):
    return sorted(
        (str(p.relative_to(path)), p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in path.rglob("*")
        if p.is_file()
    )


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_reading_never_modifies_the_database(tmp_path, backend):
    if backend == "leveldb":
        pytest.importorskip("plyvel")
    db = raw_lmdb(tmp_path / "db", ARRAYS, LABELS, backend=backend)
    before = _tree_state(db)
    layer = data_layer(db, 4, "", backend=backend.upper())
    for _ in range(3):
        layer()
    layer.close()
    del layer
    assert _tree_state(db) == before


# -- prefetching ----------------------------------------------------------------------------
def test_prefetch_thread_is_a_daemon_and_stops():
    layer = data_layer(_DB, 2, "")
    layer()
    thread = layer._prefetcher._thread
    assert thread.daemon and thread.is_alive()
    layer.close()
    assert not thread.is_alive()


def test_prefetch_thread_ends_with_the_layer():
    layer = data_layer(_DB, 2, "")
    layer()
    thread = layer._prefetcher._thread
    del layer
    import gc

    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert all(t is threading.main_thread() or t.daemon for t in threading.enumerate())


def test_feed_from_a_torch_dataloader():
    layer = data_layer(_DB, 2, "")
    ds = torch.utils.data.TensorDataset(torch.arange(8.0).view(4, 2), torch.arange(4.0))
    layer.feed_from(torch.utils.data.DataLoader(ds, batch_size=2))
    seen = [layer()[1].tolist() for _ in range(3)]
    assert seen == [[0.0, 1.0], [2.0, 3.0], [0.0, 1.0]]


# -- errors ---------------------------------------------------------------------------------
def test_missing_database_names_layer_and_source(tmp_path):
    with pytest.raises(DataError, match=r"layer 'layer' \(Data\).*nope"):
        data_layer(tmp_path / "nope", 2, "")


def test_corrupt_lmdb_is_a_data_error(tmp_path):
    db = raw_lmdb(tmp_path / "db", ARRAYS, LABELS)
    (db / "data.mdb").write_bytes(b"\0garbage" * 100)
    with pytest.raises(DataError, match="db"):
        data_layer(db, 2, "")


def test_record_that_is_not_a_datum(tmp_path):
    from torchcaffe.data.db import DBWriter

    with DBWriter(tmp_path / "db") as w:
        w.put(b"k", b"\xff\xff\xff")
    with pytest.raises(DataError, match="not a valid serialized Datum"):
        data_layer(tmp_path / "db", 2, "")


def test_empty_database(tmp_path):
    from torchcaffe.data.db import DBWriter

    with DBWriter(tmp_path / "db"):
        pass
    with pytest.raises(DataError, match="no records"):
        data_layer(tmp_path / "db", 2, "")


def test_missing_or_bad_mean_file(tmp_path):
    with pytest.raises(DataError, match=r"mean_file '.*nomean\.binaryproto'"):
        data_layer(_DB, 2, f'mean_file: "{tmp_path / "nomean.binaryproto"}"')
    (tmp_path / "bad.binaryproto").write_bytes(b"\xff\xfe garbage")
    with pytest.raises(DataError, match="bad.binaryproto"):
        data_layer(_DB, 2, f'mean_file: "{tmp_path / "bad.binaryproto"}"')


def test_crop_larger_than_the_record():
    with pytest.raises(DataError, match="crop_size is larger"):
        data_layer(_DB, 2, "crop_size: 9")


def test_batch_size_must_be_positive():
    with pytest.raises(LayerParamError, match="batch_size"):
        data_layer(_DB, 0, "")


def test_read_relative_to_the_working_directory(tmp_path, monkeypatch):
    raw_lmdb(tmp_path / "rel", ARRAYS, LABELS)
    monkeypatch.chdir(tmp_path)
    layer = data_layer("rel", 6, "")
    np.testing.assert_array_equal(layer()[0].numpy(), ARRAYS)
    assert os.getcwd() == str(tmp_path)


def test_rand_skip_is_ignored_as_caffe_1_0s_data_layer_does(tmp_path):
    """data_layer.cpp (Caffe 1.0 and the final master) never reads rand_skip; only the
    DataReader of rc2 and before skipped records (ImageData still does)."""
    db = raw_lmdb(tmp_path / "db", ARRAYS, LABELS)
    starts = set()
    for seed in range(6):
        snippet = (
            f'top: "data" top: "label" data_param {{ source: "{db}" batch_size: 1 '
            f"rand_skip: 4 backend: LMDB }}"
        )
        layer, _ = make_layer(snippet, (), type="Data", n_tops=2, phase="TEST", seed=seed)
        starts.add(int(layer()[1].item()))
    assert starts == {LABELS[0]}


def test_records_of_another_shape_inside_a_batch(tmp_path):
    arrays = [np.zeros((1, 2, 2), np.uint8), np.zeros((1, 3, 3), np.uint8)]
    db = raw_lmdb(tmp_path / "db", arrays, [0, 1])
    layer = data_layer(db, 2, "")
    with pytest.raises(DataError, match="differs from the batch's first record"):
        layer()


def test_a_bad_record_after_set_up_names_the_layer(tmp_path):
    """Set-up reads only the first record; one found bad later (in the prefetch thread) is
    located at the layer too, not only at the database."""
    from torchcaffe.data.db import DBWriter
    from torchcaffe.proto import caffe_pb2

    good = caffe_pb2.Datum(channels=1, height=1, width=1, data=b"\0").SerializeToString()
    with DBWriter(tmp_path / "db") as w:
        w.put(b"0", good)
        w.put(b"1", b"\xff\xff\xff")
    layer = data_layer(tmp_path / "db", 2, "")
    with pytest.raises(DataError, match=r"db: layer 'layer' \(Data\): record '1' is not a valid"):
        layer()


def test_deepcopy_reopens_the_source():
    import copy

    layer = data_layer(_DB, 4, "")
    first = layer()[1].tolist()
    layer()  # the prefetch thread is running now
    clone = copy.deepcopy(layer)
    assert clone()[1].tolist() == first
    clone.close()
    layer.close()
