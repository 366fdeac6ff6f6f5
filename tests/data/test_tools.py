"""convert_imageset / compute_image_mean: the same records Caffe's tools wrote, atomic writes.

The golden data cases hold the images, the list and the databases Caffe's own tools wrote from
them (meta ``tool_commands``), so our tools must reproduce every key and Datum byte.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest

import torchcaffe
from tests.helpers.datasets import image_folder
from torchcaffe.cli.__main__ import main as cli
from torchcaffe.data.db import open_db
from torchcaffe.data.tools import compute_image_mean, convert_imageset
from torchcaffe.errors import DataError

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "data"


def _tool_cases(tool):
    for meta_path in sorted(GOLDEN.glob("*/meta.json")):
        for cmd in json.loads(meta_path.read_text()).get("tool_commands", []):
            if cmd.startswith(tool):
                yield pytest.param(meta_path.parent, cmd, id=meta_path.parent.name)


@pytest.mark.parametrize("case,cmd", list(_tool_cases("convert_imageset")))
def test_convert_imageset_writes_caffes_records(case, cmd, tmp_path, monkeypatch):
    args = shlex.split(cmd)[1:]
    *flags, root, listfile, db_name = args
    backend = "leveldb" if "--backend=leveldb" in flags else "lmdb"
    if backend == "leveldb":
        pytest.importorskip("plyvel")
    monkeypatch.chdir(case)
    out = tmp_path / "db"
    assert cli(["convert_imageset", *flags, root, listfile, str(out)]) == 0
    with open_db(case / db_name, backend) as theirs, open_db(out, backend) as ours:
        assert list(ours.items()) == list(theirs.items())


@pytest.mark.parametrize("case,cmd", list(_tool_cases("compute_image_mean")))
def test_compute_image_mean_writes_caffes_bytes(case, cmd, tmp_path):
    _, db_name, mean_name = shlex.split(cmd)
    out = tmp_path / "mean.binaryproto"
    compute_image_mean(str(case / db_name), str(out))
    assert out.read_bytes() == (case / mean_name).read_bytes()


def test_db_reads_back_through_the_data_layer(tmp_path):
    images, labels = image_folder(tmp_path, [(6, 9)] * 5)
    convert_imageset(
        str(tmp_path / "images") + "/", str(tmp_path / "list.txt"), str(tmp_path / "db")
    )
    net_path = tmp_path / "net.prototxt"
    net_path.write_text(
        f'layer {{ name: "d" type: "Data" top: "data" top: "label" '
        f'data_param {{ source: "{tmp_path / "db"}" batch_size: 5 backend: LMDB }} }}'
    )
    net = torchcaffe.Net(str(net_path), torchcaffe.TEST)
    net.forward()
    want = np.stack([img.transpose(2, 0, 1) for img in images]).astype(np.float32)
    np.testing.assert_array_equal(net.blobs["data"].data, want)
    np.testing.assert_array_equal(net.blobs["label"].data, labels)


def test_encoded_gray_and_resize(tmp_path):
    image_folder(tmp_path, [(6, 9)] * 3)
    convert_imageset(
        str(tmp_path / "images") + "/",
        str(tmp_path / "list.txt"),
        str(tmp_path / "db"),
        gray=True,
        encode_type="png",
        resize_height=4,
        resize_width=5,
    )
    from torchcaffe.data.datum import datum_to_array, parse_datum

    with open_db(tmp_path / "db") as db:
        for key, value in db.items():
            datum = parse_datum(value, source="db")
            assert datum.encoded and key.startswith(b"0000000")
            assert datum_to_array(datum).shape == (1, 4, 5)


def test_interrupted_run_leaves_nothing(tmp_path):
    image_folder(tmp_path, [(4, 4)] * 6)

    def boom(items, total):
        for i, item in enumerate(items):
            if i == 3:
                raise KeyboardInterrupt
            yield item

    with pytest.raises(KeyboardInterrupt):
        convert_imageset(
            str(tmp_path / "images") + "/",
            str(tmp_path / "list.txt"),
            str(tmp_path / "db"),
            progress=boom,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "list.txt"]


def test_check_size_with_encoded_is_refused_up_front(tmp_path):
    image_folder(tmp_path, [(4, 4)])
    with pytest.raises(DataError, match="check_size cannot be combined"):
        convert_imageset(
            str(tmp_path / "images") + "/",
            str(tmp_path / "list.txt"),
            str(tmp_path / "db"),
            encoded=True,
            check_size=True,
        )
    assert not (tmp_path / "db").exists()


def test_existing_target_is_refused(tmp_path):
    image_folder(tmp_path, [(4, 4)])
    (tmp_path / "db").mkdir()
    with pytest.raises(DataError, match="already exists"):
        convert_imageset(
            str(tmp_path / "images") + "/", str(tmp_path / "list.txt"), str(tmp_path / "db")
        )


def test_unreadable_images_are_skipped_as_caffe_does(tmp_path, caplog):
    """Skipped with io.cpp's ERROR line, which scripts grep for the bad images."""
    image_folder(tmp_path, [(4, 4)] * 2)
    (tmp_path / "images" / "broken.png").write_bytes(b"not a png")
    (tmp_path / "list.txt").write_text("img_0.png 0\nmissing.png 1\nbroken.png 3\nimg_1.png 2\n")
    root = str(tmp_path / "images") + "/"
    with caplog.at_level("INFO", logger="torchcaffe.data"):
        n = convert_imageset(root, str(tmp_path / "list.txt"), str(tmp_path / "db"))
    assert n == 2
    with open_db(tmp_path / "db") as db:
        assert db.keys() == [b"00000000_img_0.png", b"00000003_img_1.png"]
    errors = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelname != "INFO"]
    assert errors == [
        ("ERROR", f"Could not open or find file {root}missing.png"),
        ("ERROR", f"Could not open or find file {root}broken.png"),
    ]


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_a_list_without_images_makes_an_empty_database_as_caffes_tool_does(tmp_path, text):
    """convert_imageset.cpp never checks its list: an empty one (or one of empty lines, each
    an image that fails to load) gives an empty database and success."""
    (tmp_path / "list.txt").write_text(text)
    db_path = tmp_path / "db"
    assert (
        cli(["convert_imageset", str(tmp_path) + "/", str(tmp_path / "list.txt"), str(db_path)])
        == 0
    )
    with open_db(db_path) as db:
        assert db.keys() == []
    assert cli(["convert_imageset", "/", str(tmp_path / "absent.txt"), str(tmp_path / "b")]) == 2


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert cli(["compute_image_mean", str(tmp_path / "nope")]) == 2
    assert "LMDB database not found" in capsys.readouterr().err


def test_check_size_refuses_a_record_of_another_size(tmp_path):
    image_folder(tmp_path, [(4, 4), (5, 4)])
    with pytest.raises(DataError, match="incorrect data field size for 'img_1.png'"):
        convert_imageset(
            str(tmp_path / "images") + "/",
            str(tmp_path / "list.txt"),
            str(tmp_path / "db"),
            check_size=True,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "list.txt"]


def test_an_empty_line_takes_a_line_number_as_in_caffes_keys(tmp_path):
    """convert_imageset.cpp's getline loop makes an entry of every line: an empty one fails
    to load and is skipped, but the keys after it count it."""
    image_folder(tmp_path, [(4, 4)] * 2)
    (tmp_path / "list.txt").write_text("img_0.png 0\n\nimg_1.png 2\n")
    n = convert_imageset(
        str(tmp_path / "images") + "/", str(tmp_path / "list.txt"), str(tmp_path / "db")
    )
    assert n == 2
    with open_db(tmp_path / "db") as db:
        assert db.keys() == [b"00000000_img_0.png", b"00000002_img_1.png"]


def test_a_name_that_is_not_utf8_keeps_its_bytes_in_the_key(tmp_path):
    image_folder(tmp_path, [(4, 4)])
    images = tmp_path / "images"
    raw = bytes(images) + b"/caf\xe9.png"
    (images / "img_0.png").rename(raw.decode("utf-8", "surrogateescape"))
    (tmp_path / "list.txt").write_bytes(b"caf\xe9.png 3\n")
    assert convert_imageset(str(images) + "/", str(tmp_path / "list.txt"), str(tmp_path / "db"))
    with open_db(tmp_path / "db") as db:
        assert db.keys() == [b"00000000_caf\xe9.png"]


def test_a_line_without_a_space_is_labelled_by_atoi_of_the_whole_line(tmp_path):
    """C's ``atoi(line.c_str() + npos + 1)`` reads the line from its start."""
    from torchcaffe.data.listfile import read_list

    (tmp_path / "list.txt").write_text("12.png\ncat.png\n7 dogs.png 4\n")
    assert read_list(str(tmp_path / "list.txt")) == [
        ("12.png", 12),
        ("cat.png", 0),
        ("7 dogs.png", 4),
    ]


def test_an_encoding_opencv_lacks_is_a_data_error(tmp_path, capsys):
    image_folder(tmp_path, [(4, 4)])
    root, listed = str(tmp_path / "images") + "/", str(tmp_path / "list.txt")
    with pytest.raises(DataError, match="OpenCV cannot encode as 'xyz'"):
        convert_imageset(root, listed, str(tmp_path / "db"), encode_type="xyz")
    assert cli(["convert_imageset", "-encode_type=xyz", root, listed, str(tmp_path / "db")]) == 2
    assert "cannot encode as 'xyz'" in capsys.readouterr().err


def test_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path, capsys):
    image_folder(tmp_path, [(4, 4)] * 3)
    root, listed = str(tmp_path / "images") + "/", str(tmp_path / "list.txt")
    assert cli(["convert_imageset", root, listed, str(tmp_path / "db")]) == 0
    assert "\r" not in capsys.readouterr().err  # a redirected log gets no bar redraws


def test_the_database_folder_has_the_mode_caffes_tools_give_it(tmp_path):
    """db_lmdb.cpp's mkdir(source, 0744), under the umask (mkdtemp's 0700 before)."""
    import os

    from torchcaffe.formats.atomic import current_umask

    image_folder(tmp_path, [(4, 4)])
    root, listed = str(tmp_path / "images") + "/", str(tmp_path / "list.txt")
    convert_imageset(root, listed, str(tmp_path / "db"))
    assert os.stat(tmp_path / "db").st_mode & 0o777 == 0o744 & ~current_umask()


def test_shuffle_maps_draws_as_boost_uniform_int():
    """caffe::shuffle draws each index with boost::uniform_int over mt19937: the draw divided
    by a bucket size (not taken modulo). Seed 42, ten items: the permutation a line-by-line
    port of boost's generate_uniform_int gives."""
    from torchcaffe.data.rng import CaffeRNG

    items = list(range(10))
    CaffeRNG(42).shuffle(items)
    assert items == [5, 0, 6, 2, 9, 4, 1, 8, 7, 3]
    rng, twin = CaffeRNG(3), CaffeRNG(3)
    assert [rng._uniform_int(1) for _ in range(8)] == [twin.draw() >> 31 for _ in range(8)]


GLOG_LINE = r"I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] "


def _logged(err: str) -> list[str]:
    """The messages of glog-prefixed lines (Caffe's tools log to stderr, nothing to stdout)."""
    import re

    lines = [line for line in err.splitlines() if line]
    assert all(re.match(GLOG_LINE, line) for line in lines), lines
    return [re.sub(GLOG_LINE, "", line) for line in lines]


def test_compute_image_mean_logs_caffes_lines(tmp_path, capsys):
    case = GOLDEN / "data_lmdb_crop_meanfile"
    out = tmp_path / "mean.binaryproto"
    assert cli(["compute_image_mean", str(case / "lmdb"), str(out)]) == 0
    std = capsys.readouterr()
    assert std.out == ""
    # the per-channel values: compute_image_mean.cpp's float sums over Caffe's own mean file
    from torchcaffe.io import blobproto_to_array
    from torchcaffe.proto import caffe_pb2 as pb

    blob = pb.BlobProto.FromString((case / "mean.binaryproto").read_bytes())
    planes = blobproto_to_array(blob)[0].reshape(3, -1)
    values = []
    for plane in planes:
        total = np.float32(0)
        for v in plane:
            total = np.float32(total + v)
        values.append(format(total / np.float32(plane.size), ".6g"))
    with open_db(case / "lmdb") as db:
        count = len(db)
    assert _logged(std.err) == [
        "Starting iteration",
        f"Processed {count} files.",
        f"Write to {out}",
        "Number of channels: 3",
        *[f"mean_value channel [{c}]: {v}" for c, v in enumerate(values)],
    ]


def test_convert_imageset_logs_caffes_lines(tmp_path, capsys):
    image_folder(tmp_path, [(4, 4)] * 3)
    root, listed = str(tmp_path / "images") + "/", str(tmp_path / "list.txt")
    assert cli(["convert_imageset", "-shuffle", root, listed, str(tmp_path / "db")]) == 0
    std = capsys.readouterr()
    assert std.out == ""
    assert _logged(std.err) == ["Shuffling data", "A total of 3 images.", "Processed 3 files."]


def test_compute_image_mean_says_when_it_decodes_an_encoded_database(tmp_path, capsys):
    """compute_image_mean.cpp logs "Decoding Datum" when its first record is encoded, then
    "Starting iteration" before summing (and nothing to stdout, with no output file)."""
    image_folder(tmp_path, [(4, 4)] * 2)
    root, listed = str(tmp_path / "images") + "/", str(tmp_path / "list.txt")
    assert cli(["convert_imageset", "-encode_type=png", root, listed, str(tmp_path / "db")]) == 0
    capsys.readouterr()
    assert cli(["compute_image_mean", str(tmp_path / "db")]) == 0
    std = capsys.readouterr()
    assert std.out == ""
    assert _logged(std.err)[:3] == ["Decoding Datum", "Starting iteration", "Processed 2 files."]


@pytest.mark.parametrize(
    "env,flags,lines",
    [
        (None, ["-minloglevel=1"], 0),  # INFO dropped, as glog's -minloglevel does
        ("2", [], 0),  # glog reads GLOG_minloglevel when the flag is absent
        ("2", ["--minloglevel", "0"], 7),  # the flag wins over the environment
        ("junk", [], 7),
    ],
)
def test_tools_follow_glogs_minloglevel(tmp_path, capsys, monkeypatch, env, flags, lines):
    if env is None:
        monkeypatch.delenv("GLOG_minloglevel", raising=False)
    else:
        monkeypatch.setenv("GLOG_minloglevel", env)
    db = str(GOLDEN / "data_lmdb_crop_meanfile" / "lmdb")
    assert cli(["compute_image_mean", *flags, db, str(tmp_path / "m.binaryproto")]) == 0
    err = capsys.readouterr().err
    assert len(_logged(err)) == lines, err
    assert "has no effect" not in err
