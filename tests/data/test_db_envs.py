"""The process's shared read-only LMDB environments (data/db.py): one per database file, so a
database written again at the same path is read afresh, and released by the key it was
opened with, whatever the working directory is by then."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe.proto import caffe_pb2

lmdb = pytest.importorskip("lmdb")

NET = 'layer { name: "d" type: "Data" top: "data" data_param { source: "db" batch_size: 2 backend: LMDB } }\n'  # noqa: E501


def _make_db(path, value: int) -> None:
    shutil.rmtree(path, ignore_errors=True)
    env = lmdb.open(str(path), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for i in range(2):
            datum = caffe_pb2.Datum(channels=1, height=1, width=1, data=bytes([value]))
            txn.put(b"%08d" % i, datum.SerializeToString())
    env.close()


def test_a_database_written_again_is_read_afresh(tmp_path, monkeypatch):
    """Caffe's Data layer opens its source itself: a net built after the database was
    rebuilt reads the new records, even while a net on the old one is alive."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(NET)
    _make_db(tmp_path / "db", 1)
    old = caffe.Net("net.prototxt", caffe.TEST)
    old.forward()
    _make_db(tmp_path / "db", 200)
    new = caffe.Net("net.prototxt", caffe.TEST)
    new.forward()
    np.testing.assert_array_equal(new.blobs["data"].data.ravel(), [200, 200])
    np.testing.assert_array_equal(old.blobs["data"].data.ravel(), [1, 1])


def test_closing_a_net_after_a_chdir_leaves_another_nets_database_open(tmp_path, monkeypatch):
    for folder, value in (("a", 3), ("b", 7)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "net.prototxt").write_text(NET)
        _make_db(tmp_path / folder / "db", value)
    monkeypatch.chdir(tmp_path / "a")
    a = caffe.Net("net.prototxt", caffe.TEST)
    a.forward()
    monkeypatch.chdir(tmp_path / "b")
    b = caffe.Net("net.prototxt", caffe.TEST)
    del a  # its reader releases the environment it opened (folder a's), not b's
    import gc

    gc.collect()
    b.forward()
    np.testing.assert_array_equal(b.blobs["data"].data.ravel(), [7, 7])


def test_a_truncated_database_is_a_clear_error_not_a_crash(tmp_path):
    """LMDB maps its file: a data.mdb cut short (a copy interrupted) made a read touch a page
    past its end, and the process died of SIGBUS. Checked against the file's own header when
    opened; run in a child process, which such a regression would kill."""
    db = tmp_path / "db"
    env = lmdb.open(str(db), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for i in range(200):
            txn.put(b"%08d" % i, caffe_pb2.Datum(channels=1, height=8, width=8).SerializeToString())
    env.close()
    data = (db / "data.mdb").read_bytes()
    code = (
        "import sys\n"
        "from torchcaffe.data.db import open_db\n"
        "from torchcaffe.errors import DataError\n"
        "try:\n"
        "    print(sum(1 for _ in open_db(sys.argv[1]).items()))\n"
        "except DataError as err:\n"
        "    print('DataError', err)\n"
    )
    for size in (len(data), len(data) - 1, len(data) // 2, 3 * 4096 + 10):
        (db / "data.mdb").write_bytes(data[:size])
        run = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        want = "200" if size == len(data) else "DataError"
        assert run.stdout.startswith(want) and ("truncated" in run.stdout) == (want != "200")
