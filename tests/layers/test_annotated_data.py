"""AnnotatedData (SSD): AnnotatedDatum records, boxes carried through expand / sample-crop /
resize / mirror, label rows, and the box geometry of the fork's bbox_util."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.data import ssd
from torchcaffe.data.db import DBWriter
from torchcaffe.data.rng import CaffeRNG
from torchcaffe.errors import DataError, TorchCaffeError
from torchcaffe.proto import caffe_pb2 as pb

RNG = np.random.default_rng(9)
IMAGES = [RNG.integers(0, 256, (12, 16, 3), dtype=np.uint8) for _ in range(3)]
BOXES = [  # per image: (group_label, instance_id, xmin, ymin, xmax, ymax, difficult)
    [(1, 0, 0.25, 0.25, 0.5, 0.75, False), (2, 0, 0.5, 0.0, 1.0, 0.5, True)],
    [(3, 1, 0.0, 0.0, 0.5, 0.5, False)],
    [],
]


def anno_db(path: Path, encoded: bool = False, typed: bool = True) -> Path:
    with DBWriter(path) as db:
        for i, (img, boxes) in enumerate(zip(IMAGES, BOXES)):
            anno = pb.AnnotatedDatum()
            if typed:
                anno.type = pb.AnnotatedDatum.BBOX
            d = anno.datum
            if encoded:
                d.data, d.encoded = cv2.imencode(".png", img)[1].tobytes(), True
            else:
                d.channels, d.height, d.width = 3, *img.shape[:2]
                d.data = img.transpose(2, 0, 1).tobytes()
            d.label = i
            for label, inst, x0, y0, x1, y1, diff in boxes:
                group = next((g for g in anno.annotation_group if g.group_label == label), None)
                if group is None:
                    group = anno.annotation_group.add(group_label=label)
                a = group.annotation.add(instance_id=inst)
                a.bbox.xmin, a.bbox.ymin, a.bbox.xmax, a.bbox.ymax = x0, y0, x1, y1
                a.bbox.difficult = diff
            db.put(f"{i:08d}".encode(), anno.SerializeToString())
    return path


_DIR = Path(tempfile.mkdtemp(prefix="torchcaffe-annotated-case-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
anno_db(_DIR / "db")

CASES = [
    LayerCase(
        "AnnotatedData",
        f'top: "data" top: "label" transform_param {{ mean_value: 100 scale: 0.5 }} '
        f'data_param {{ source: "{_DIR / "db"}" batch_size: 3 backend: LMDB }}',
        bottom_shapes=(),
        n_tops=2,
        phase="TEST",
    )
]


def layer(db, transform="", extra="", phase="TEST", batch=3):
    snippet = (
        f'top: "data" top: "label" transform_param {{ {transform} }} '
        f'data_param {{ source: "{db}" batch_size: {batch} backend: LMDB }} '
        f"annotated_data_param {{ {extra} }}"
    )
    return make_layer(snippet, (), type="AnnotatedData", n_tops=2, phase=phase)[0]


def rows_of(items):
    return np.asarray(
        [
            [i, g, inst, x0, y0, x1, y1, float(d)]
            for i in items
            for g, inst, x0, y0, x1, y1, d in BOXES[i]
        ],
        np.float32,
    )


def test_plain_records_and_label_rows(tmp_path):
    db = anno_db(tmp_path / "db", encoded=True)
    m = layer(db, "mean_value: 100 scale: 0.5")
    assert m.output_shapes([]) == [(3, 3, 12, 16), (1, 1, 2, 8)]
    data, label = m()
    want = np.stack([(im.transpose(2, 0, 1) - np.float32(100)) * np.float32(0.5) for im in IMAGES])
    np.testing.assert_array_equal(data.numpy(), want)
    np.testing.assert_allclose(label.numpy()[0, 0], rows_of([0, 1, 2]), rtol=1e-6)


def test_untyped_records_give_datum_labels(tmp_path):
    db = anno_db(tmp_path / "db", typed=False)
    _, label = layer(db)()
    np.testing.assert_array_equal(label.numpy(), [0, 1, 2])


def test_no_surviving_box_is_one_row_of_minus_one(tmp_path):
    db = anno_db(tmp_path / "db")
    m = layer(db, batch=1)
    m()
    m()
    _, label = m()  # the third image has no box
    np.testing.assert_array_equal(label.numpy(), -np.ones((1, 1, 1, 8), np.float32))


def test_warp_resize_keeps_boxes_and_mirror_flips_them(tmp_path):
    db = anno_db(tmp_path / "db")
    torch.manual_seed(0)
    m = layer(
        db,
        "mirror: true resize_param { resize_mode: WARP height: 6 width: 8 }",
        phase="TRAIN",
        batch=1,
    )
    seen = set()
    for _ in range(8):
        data, label = m()
        if label[0, 0, 0, 1] != 1:  # only the first record (group labels 1, 2) is checked
            continue
        img = cv2.resize(IMAGES[0], (8, 6)).transpose(2, 0, 1).astype(np.float32)
        want = rows_of([0])
        mirrored = np.array_equal(data.numpy()[0], img[:, :, ::-1])
        if mirrored:
            want[:, 3], want[:, 5] = 1 - want[:, 5], 1 - want[:, 3]
        else:
            np.testing.assert_array_equal(data.numpy()[0], img)
        np.testing.assert_allclose(label.numpy()[0, 0], want, rtol=1e-6, atol=1e-7)
        seen.add(mirrored)
    assert seen == {True, False}


@pytest.mark.parametrize("encoded", [True, False])
def test_mirror_with_mean_file_reads_the_mean_where_the_fork_does(tmp_path, encoded):
    """SSD's cv::Mat path (encoded records) subtracts the mean at the output pixel of a
    mirrored image; its Datum path (raw records) at the source pixel, as BVLC's."""
    db = anno_db(tmp_path / "db", encoded=encoded)
    mean = RNG.random((1, 3, 12, 16), dtype=np.float32) * 50
    blob = pb.BlobProto(num=1, channels=3, height=12, width=16)
    blob.data.extend(mean.ravel().tolist())
    (tmp_path / "mean.binaryproto").write_bytes(blob.SerializeToString())
    torch.manual_seed(1)
    m = layer(db, f'mirror: true mean_file: "{tmp_path / "mean.binaryproto"}"', batch=3)
    seen = set()
    for _ in range(4):
        data, _ = m()
        for item, img in enumerate(IMAGES):
            chw = img.transpose(2, 0, 1).astype(np.float32)
            plain = chw - mean[0]
            flipped = chw[:, :, ::-1] - (mean[0] if encoded else mean[0][:, :, ::-1])
            got = data.numpy()[item]
            mirrored = np.array_equal(got, flipped)
            assert mirrored or np.array_equal(got, plain)
            seen.add(mirrored)
    assert seen == {True, False}


def test_expand_and_sample_keep_boxes_on_their_pixels(tmp_path):
    """A box painted white stays under its label row through expansion and sample crops."""
    img = np.zeros((40, 40, 3), np.uint8)
    img[10:30, 8:24] = 255
    with DBWriter(tmp_path / "db") as db:
        anno = pb.AnnotatedDatum(type=pb.AnnotatedDatum.BBOX)
        anno.datum.channels, anno.datum.height, anno.datum.width = 3, 40, 40
        anno.datum.data = img.transpose(2, 0, 1).tobytes()
        a = anno.annotation_group.add(group_label=1).annotation.add()
        a.bbox.xmin, a.bbox.ymin, a.bbox.xmax, a.bbox.ymax = 8 / 40, 10 / 40, 24 / 40, 30 / 40
        db.put(b"0", anno.SerializeToString())
    sampler = (
        "batch_sampler { sampler { min_scale: 0.5 max_scale: 1 min_aspect_ratio: 0.5 "
        "max_aspect_ratio: 2 } sample_constraint { min_object_coverage: 1 } "
        "max_trials: 50 max_sample: 1 }"
    )
    torch.manual_seed(3)
    m = layer(
        tmp_path / "db",
        "expand_param { prob: 1 max_expand_ratio: 2 } "
        "resize_param { resize_mode: WARP height: 64 width: 64 interp_mode: NEAREST }",
        sampler,
        phase="TRAIN",
        batch=1,
    )
    for _ in range(6):
        data, label = m()
        x0, y0, x1, y1 = (label.numpy()[0, 0, 0, 3:7] * 64).tolist()
        inside = data.numpy()[
            0, 0, int(np.ceil(y0)) + 4 : int(y1) - 4, int(np.ceil(x0)) + 4 : int(x1) - 4
        ]  # the fork crops whole pixels but moves boxes exactly: edges may shift a pixel
        assert inside.size and (inside == 255).all()
        outside = data.numpy()[0, 0].copy()
        outside[
            max(0, int(y0) - 4) : int(np.ceil(y1)) + 4, max(0, int(x0) - 4) : int(np.ceil(x1)) + 4
        ] = 0
        assert (outside == 0).all()


def test_errors(tmp_path):
    with pytest.raises(DataError, match="nope"):
        layer(tmp_path / "nope")
    db = anno_db(tmp_path / "db")
    with pytest.raises(TorchCaffeError, match="noise_param"):
        layer(db, "noise_param { prob: 1 }")
    with DBWriter(tmp_path / "bad") as w:
        w.put(b"0", b"\xff\xff")
    with pytest.raises(DataError, match="not a valid serialized AnnotatedDatum"):
        layer(tmp_path / "bad")


# -- bbox_util geometry ---------------------------------------------------------------------
def box(*v):
    return ssd.Box(*(np.float32(x) for x in v))


def test_jaccard_coverage_project_locate():
    a, b = box(0, 0, 0.5, 0.5), box(0.25, 0.25, 0.75, 0.75)
    assert ssd.jaccard(a, b) == pytest.approx(0.0625 / (0.25 + 0.25 - 0.0625))
    assert ssd.coverage(a, b) == pytest.approx(0.25)
    p = ssd.project(box(0.5, 0.5, 1, 1), b)
    assert (p.xmin, p.ymin, p.xmax, p.ymax) == pytest.approx((0, 0, 0.5, 0.5))
    assert ssd.project(box(0.8, 0.8, 1, 1), a) is None
    loc = ssd.locate(box(0.5, 0.5, 1, 1), box(0, 0, 0.5, 0.5))
    assert (loc.xmin, loc.xmax) == pytest.approx((0.5, 0.75))


def test_samples_meet_their_constraint():
    bs = pb.BatchSampler(max_trials=200)
    bs.sampler.min_scale, bs.sampler.max_aspect_ratio = 0.3, 2.0
    bs.sampler.min_aspect_ratio = 0.5
    bs.sample_constraint.min_jaccard_overlap = 0.5
    obj = box(0.2, 0.2, 0.7, 0.7)
    out = ssd.batch_samples(CaffeRNG(5), [(1, [(0, obj)])], [bs])
    assert out and all(ssd.jaccard(s, obj) >= 0.5 for s in out)
    assert all(0 <= s.xmin and s.xmax <= 1.0001 for s in out)


def test_expand_places_the_image_and_its_box():
    img = np.full((4, 6, 3), 7, np.uint8)
    canvas, b = ssd.expand_image(CaffeRNG(1), img, 2.0, np.array([1, 2, 3], np.uint8))
    assert canvas.shape == (8, 12, 3)
    x0, y0 = int(round(-b.xmin * 6)), int(round(-b.ymin * 4))
    assert (canvas[y0 : y0 + 4, x0 : x0 + 6] == 7).all()
    assert (canvas[:, :, 0] != 7).sum() == 8 * 12 - 24


def test_distort_brightness_is_one_uniform_shift():
    img = np.full((4, 4, 3), 100, np.uint8)
    p = pb.DistortionParameter(brightness_prob=1, brightness_delta=32)
    out = ssd.distort(CaffeRNG(2), img, p).astype(int)
    shift = out[0, 0, 0] - 100
    assert (out - 100 == shift).all() and -32 <= shift <= 32 and shift != 0


def test_distort_with_zero_probabilities_is_identity():
    img = RNG.integers(0, 256, (5, 5, 3), dtype=np.uint8)
    assert np.array_equal(ssd.distort(CaffeRNG(0), img, pb.DistortionParameter()), img)
