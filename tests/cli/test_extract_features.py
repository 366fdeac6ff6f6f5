"""extract_features, as Caffe's tools/extract_features.cpp: one Datum per item of each batch,
keys ``%010d``, legacy channels/height/width, no label, into new databases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcaffe as caffe
from tests.helpers.datasets import raw_lmdb
from torchcaffe.cli.__main__ import build_parser, main
from torchcaffe.data.db import open_db
from torchcaffe.proto import caffe_pb2

NET = """
name: "tiny"
layer {{ name: "data" type: "Data" top: "data" top: "label"
  transform_param {{ scale: 0.00390625 }}
  data_param {{ source: "{source}" batch_size: 2 backend: LMDB }} }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param {{ num_output: 2 kernel_size: 3
    weight_filler {{ type: "gaussian" std: 1 }} bias_filler {{ type: "constant" value: 0.5 }} }} }}
layer {{ name: "fc" type: "InnerProduct" bottom: "conv" top: "fc"
  inner_product_param {{ num_output: 3 weight_filler {{ type: "gaussian" std: 1 }} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "fc" top: "fc" }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }}
"""
BLOBS = ["fc", "conv", "label", "loss"]


@pytest.fixture
def tiny(tmp_path):
    """A net reading 5 records in batches of 2, and weights for it."""
    images = np.random.default_rng(0).integers(0, 256, (5, 1, 4, 4), dtype=np.uint8)
    raw_lmdb(tmp_path / "images", images, [i % 3 for i in range(5)])
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET.format(source=tmp_path / "images"))
    weights = tmp_path / "w.caffemodel"
    caffe.Net(str(proto), caffe.TEST).save(str(weights))
    return proto, weights


def _forwards(proto, weights, batches: int) -> dict[str, np.ndarray]:
    """Each blob's items over ``batches`` forwards of a fresh net (one row per item)."""
    net = caffe.Net(str(proto), str(weights), caffe.TEST)
    rows: dict[str, list[np.ndarray]] = {name: [] for name in BLOBS}
    for _ in range(batches):
        net.forward()
        for name in BLOBS:
            rows[name].append(net.blobs[name].data.reshape(net.blobs[name].num, -1).copy())
    return {name: np.concatenate(r) for name, r in rows.items()}


def _read(path, backend="lmdb") -> list[tuple[bytes, caffe_pb2.Datum]]:
    with open_db(path, backend) as db:
        return [(k, caffe_pb2.Datum.FromString(v)) for k, v in db.items()]


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_extracts_each_item_of_each_batch_as_caffe_does(tmp_path, tiny, capsys, backend):
    if backend == "leveldb":
        pytest.importorskip("plyvel")
    proto, weights = tiny
    outs = [str(tmp_path / f"f_{name}") for name in BLOBS]
    argv = [str(weights), str(proto), ",".join(BLOBS), ",".join(outs), "3", backend]
    assert main(["extract_features", *argv]) == 0
    want = _forwards(proto, weights, 3)
    shapes = {"fc": (3, 1, 1), "conv": (2, 2, 2), "label": (1, 1, 1), "loss": (1, 1, 1)}
    for name, out in zip(BLOBS, outs):
        records = _read(out, backend)
        assert [k for k, _ in records] == [b"%010d" % i for i in range(len(want[name]))]
        for i, (_, datum) in enumerate(records):
            assert (datum.channels, datum.height, datum.width) == shapes[name]
            assert not datum.HasField("label") and not datum.HasField("data")
            np.testing.assert_array_equal(np.array(datum.float_data, np.float32), want[name][i])
    # 6 items from 5 records: the data layer wrapped to the first record
    np.testing.assert_array_equal(want["fc"][5], want["fc"][0])
    err = capsys.readouterr().err
    assert "Extracted features of 6 query images for feature blob fc" in err
    assert "Extracted features of 3 query images for feature blob loss" in err
    assert "Successfully extracted the features!" in err


def test_datum_bytes_are_caffes(tmp_path, tiny):
    """channels, height, width then unpacked float_data, as Caffe's SerializeToString."""
    proto, weights = tiny
    out = tmp_path / "fc"
    assert main(["extract_features", str(weights), str(proto), "fc", str(out), "1", "lmdb"]) == 0
    with open_db(out) as db:
        value = db.get(b"0000000000")
    values = caffe_pb2.Datum.FromString(value).float_data
    want = b"\x08\x03\x10\x01\x18\x01" + b"".join(b"\x35" + np.float32(v).tobytes() for v in values)
    assert value == want


def test_an_existing_database_is_refused_and_nothing_written(tmp_path, tiny, capsys):
    proto, weights = tiny
    (tmp_path / "taken").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    outs = f"{tmp_path / 'new'},{tmp_path / 'taken'}"
    assert main(["extract_features", str(weights), str(proto), "fc,conv", outs, "1", "lmdb"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    "blobs, dbs, batches, message",
    [
        ("fc,nope", "a,b", "1", "unknown feature blob name 'nope'"),
        ("fc,", "a,b", "1", "unknown feature blob name ''"),
        ("fc,conv", "a", "1", "number of blob names and dataset names must be equal"),
        ("fc,conv", "a,a", "1", "the same database is named twice"),
        ("fc", "a", "-1", "num_mini_batches must not be negative"),
        ("fc", "a", "x", "invalid int value"),
    ],
)
def test_bad_arguments_are_one_line_and_leave_nothing(
    tmp_path, tiny, capsys, monkeypatch, blobs, dbs, batches, message
):
    proto, weights = tiny
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = ["extract_features", str(weights), str(proto), blobs, dbs, batches, "lmdb"]
    try:
        rc = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        rc = exit_.code
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_swapped_weights_and_prototxt_are_refused_with_caffes_order(tmp_path, tiny, capsys):
    proto, weights = tiny
    out = tmp_path / "f"
    assert main(["extract_features", str(proto), str(weights), "fc", str(out), "1", "lmdb"]) == 2
    err = capsys.readouterr().err
    assert "look swapped" in err and "weights first" in err
    assert not out.exists()


def test_a_missing_output_folder_is_refused_before_the_net_is_built(tmp_path, capsys):
    out = tmp_path / "no" / "f"
    argv = ["w.caffemodel", "absent.prototxt", "fc", str(out), "1", "lmdb"]
    assert main(["extract_features", *argv]) == 2
    assert f"{tmp_path / 'no'}: the output directory does not exist" in capsys.readouterr().err


def test_a_failure_mid_run_leaves_no_database(tmp_path, tiny, monkeypatch):
    proto, weights = tiny
    calls = []

    def failing_forward(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_forward(self, *args, **kwargs)

    real_forward = caffe.Net.forward
    monkeypatch.setattr(caffe.Net, "forward", failing_forward)
    before = sorted(p.name for p in tmp_path.iterdir())
    out = str(tmp_path / "f")
    assert main(["extract_features", str(weights), str(proto), "fc", out, "3", "lmdb"]) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_blob_of_more_than_4_axes_is_refused_by_name(tmp_path, tiny, capsys):
    proto, weights = tiny
    with open(proto, "a") as f:
        f.write(
            'layer { name: "r" type: "Reshape" bottom: "conv" top: "r5" '
            "reshape_param { shape { dim: 0 dim: 1 dim: 2 dim: 2 dim: 2 } } }"
        )
    out = tmp_path / "f"
    assert main(["extract_features", str(weights), str(proto), "r5", str(out), "1", "lmdb"]) == 2
    assert "feature blob 'r5' has more than 4 axes" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where CUDA is absent")
def test_gpu_mode_without_cuda_says_so_in_this_tools_terms(tmp_path, tiny, capsys):
    proto, weights = tiny
    out = tmp_path / "f"
    argv = [str(weights), str(proto), "fc", str(out), "1", "lmdb", "GPU", "1"]
    assert main(["extract_features", *argv]) == 2
    err = capsys.readouterr().err
    assert "GPU mode: CUDA is not available" in err and "-gpu" not in err
    assert not out.exists()


def test_zero_batches_write_empty_databases(tmp_path, tiny):
    proto, weights = tiny
    out = tmp_path / "empty"
    assert main(["extract_features", str(weights), str(proto), "fc", str(out), "0", "lmdb"]) == 0
    assert _read(out) == []


def test_listed_in_the_help():
    parser, actions = build_parser()
    assert "extract_features" in actions
    assert "extract_features" in parser.format_help()
