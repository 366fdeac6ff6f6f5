"""DetectionEvaluate (SSD fork): per-class positive counts, TP/FP per detection by descending
score, difficult ground truth, the -1 rows of both bottoms, zero padding, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import ssd_reference as ref
from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import DataError, LayerParamError, UnsupportedError


def make_data(rng, num_images=3, num_gt=6, labels=(1, 2, 3), placeholder=True):
    """(det (1, 1, D, 7), gt (1, 1, G, 8)): noisy copies of the gt boxes plus random boxes,
    one detection row of image -1 and one placeholder [i, -1, ...] row (which the fork
    rejects as a background label when background_label_id is -1)."""
    gt = []
    for _ in range(num_gt):
        c = rng.uniform(0.2, 0.8, 2)
        wh = rng.uniform(0.1, 0.4, 2)
        gt.append(
            [
                rng.integers(num_images - 1),
                rng.choice(labels),
                0,
                *(c - wh / 2),
                *(c + wh / 2),
                float(rng.random() < 0.3),
            ]
        )
    det = []
    for g in gt:
        for _ in range(rng.integers(0, 3)):
            box = np.asarray(g[3:7]) + rng.normal(0, 0.03, 4)
            det.append([g[0], g[1], rng.random(), *box])
    for _ in range(4):
        c = rng.uniform(0.1, 0.9, 2)
        det.append(
            [rng.integers(num_images), rng.choice(labels), rng.random(), *(c - 0.1), *(c + 0.1)]
        )
    det.append([-1, 2, 0.5, 0.1, 0.1, 0.3, 0.3])  # counted in the top shape, never written
    if placeholder:
        det.append([num_images - 1, -1, -1, -1, -1, -1, -1])  # DetectionOutput's placeholder
    det = np.array(det)[rng.permutation(len(det))]
    return det[None, None], np.array(gt)[None, None]


def _bottoms(seed, placeholder=True):
    def make(g):
        rng = np.random.default_rng(int(torch.randint(1 << 30, (1,), generator=g)) + seed)
        return [torch.tensor(a) for a in make_data(rng, placeholder=placeholder)]

    return make


def _shapes(seed, placeholder=True):
    make = _bottoms(seed, placeholder)
    return [tuple(b.shape) for b in make(torch.Generator().manual_seed(1701))]


CASES = [
    LayerCase(
        "DetectionEvaluate",
        "detection_evaluate_param { num_classes: 4 }",
        _shapes(0),
        make_bottoms=_bottoms(0),
        phase="TEST",
        id="deteval_default",
    ),
    LayerCase(
        "DetectionEvaluate",
        "detection_evaluate_param { num_classes: 4 "
        "background_label_id: 4294967295 overlap_threshold: 0.3 "
        "evaluate_difficult_gt: false }",
        _shapes(1, False),
        make_bottoms=_bottoms(1, False),
        phase="TEST",
        id="deteval_no_background",
    ),
]


def ref_detection_evaluate(
    det, gt, num_classes, background=0, overlap_threshold=0.5, evaluate_difficult=True
):
    """The fork's Forward_cpu with normalized boxes: rows [image, label, score, tp, fp]."""
    all_det, all_gt = {}, {}
    for row in det.reshape(-1, 7):
        if int(row[0]) != -1:
            all_det.setdefault(int(row[0]), {}).setdefault(int(row[1]), []).append(row)
    for row in gt.reshape(-1, 8):
        if int(row[0]) == -1:
            break
        all_gt.setdefault(int(row[0]), {}).setdefault(int(row[1]), []).append(row)
    num_pos = {}
    for labels in all_gt.values():
        for label, rows in labels.items():
            n = sum(1 for r in rows if evaluate_difficult or not r[7])
            num_pos[label] = num_pos.get(label, 0) + n
    out = [[-1, c, num_pos.get(c, 0), -1, -1] for c in range(num_classes) if c != background]
    for item in sorted(all_det):
        for label in sorted(all_det[item]):
            if label == -1:
                continue
            dets = all_det[item][label]
            gts = all_gt.get(item, {}).get(label)
            if gts is None:
                out += [[item, label, d[2], 0, 1] for d in dets]
                continue
            visited = [False] * len(gts)
            for d in sorted(dets, key=lambda d: -d[2]):
                overlaps = [ref.jaccard(d[3:7], g[3:7]) for g in gts]
                j = int(np.argmax(overlaps))
                flags = [0, 1]
                if overlaps[j] >= overlap_threshold:
                    if evaluate_difficult or not gts[j][7]:
                        flags = [0, 1] if visited[j] else [1, 0]
                        visited[j] = True
                    else:
                        flags = [0, 0]
                out.append([item, label, d[2], *flags])
    rows = (num_classes - (background != -1)) + int((det.reshape(-1, 7)[:, 1] != -1).sum())
    out += [[0] * 5] * (rows - len(out))
    return np.array(out, dtype=np.float64).reshape(1, 1, rows, 5)


def _run(snippet, det, gt):
    layer, _ = make_layer(
        f"detection_evaluate_param {{ {snippet} }}",
        [det.shape, gt.shape],
        type="DetectionEvaluate",
        phase="TEST",
        dtype=torch.float64,
    )
    return layer(torch.tensor(det), torch.tensor(gt))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "snippet,kw",
    [
        ("num_classes: 4", {}),
        (
            "num_classes: 4 evaluate_difficult_gt: false overlap_threshold: 0.6",
            dict(evaluate_difficult=False, overlap_threshold=0.6),
        ),
        (
            "num_classes: 5 background_label_id: 4294967295 overlap_threshold: 0.2",
            dict(num_classes=5, background=-1, overlap_threshold=0.2),
        ),
        ("num_classes: 5 background_label_id: 4", dict(num_classes=5, background=4)),
    ],
)
def test_forward_matches_reference(seed, snippet, kw):
    det, gt = make_data(np.random.default_rng(seed), placeholder=kw.get("background") != -1)
    top = _run(snippet, det, gt)
    want = ref_detection_evaluate(det, gt, **{"num_classes": 4, **kw})
    np.testing.assert_allclose(top.numpy(), want, rtol=0, atol=0)


def test_greedy_true_and_false_positives_and_difficult():
    """Descending score: the best-overlapping gt is a TP once, then FP; a difficult one
    (not evaluated) gives neither; gt rows after the first image -1 row are dropped."""
    gt = np.array(
        [
            [0, 1, 0, 0.1, 0.1, 0.5, 0.5, 0],
            [0, 1, 1, 0.6, 0.6, 0.9, 0.9, 1],
            [-1, 1, 0, 0, 0, 0, 0, 0],
            [0, 2, 0, 0.1, 0.1, 0.5, 0.5, 0],
        ]
    )[None, None]
    det = np.array(
        [
            [0, 1, 0.6, 0.1, 0.1, 0.5, 0.5],
            [0, 1, 0.9, 0.11, 0.1, 0.5, 0.5],
            [0, 1, 0.7, 0.6, 0.6, 0.9, 0.9],
            [1, 1, 0.8, 0.1, 0.1, 0.5, 0.5],
            [0, 2, 0.4, 0.1, 0.1, 0.5, 0.5],
        ]
    )[None, None]
    top = _run("num_classes: 3 evaluate_difficult_gt: false", det, gt)[0, 0].tolist()
    assert top == [
        [-1, 1, 1, -1, -1],
        [-1, 2, 0, -1, -1],  # gt after the -1 row is dropped
        [0, 1, 0.9, 1, 0],
        [0, 1, 0.7, 0, 0],
        [0, 1, 0.6, 0, 1],
        [0, 2, 0.4, 0, 1],
        [1, 1, 0.8, 0, 1],
    ]


def test_no_backward_and_output_shape():
    layer, _ = make_layer(
        "detection_evaluate_param { num_classes: 4 }",
        [(1, 1, 5, 7), (1, 1, 2, 8)],
        type="DetectionEvaluate",
    )
    assert not layer.has_backward and not layer.allow_force_backward(0)
    assert layer.output_shapes([(1, 1, 5, 7), (1, 1, 2, 8)]) == [(1, 1, 3 + 5, 5)]


@pytest.mark.parametrize(
    "snippet,shapes,match",
    [
        ("overlap_threshold: 0.5", None, r"must provide num_classes"),
        ("num_classes: 3 overlap_threshold: 0", None, r"overlap_threshold must be positive"),
        ("num_classes: 3", [(1, 1, 5, 6), (1, 1, 2, 8)], r"bottom 0 must be \(1, 1, rows, 7\)"),
        ("num_classes: 3", [(2, 1, 5, 7), (1, 1, 2, 8)], r"bottom 0 must be \(1, 1, rows, 7\)"),
        ("num_classes: 3", [(1, 1, 5, 7), (1, 2, 8)], r"bottom 1 must be \(1, 1, rows, 8\)"),
    ],
)
def test_error_bad_params_and_shapes(snippet, shapes, match):
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(DetectionEvaluate\): " + match):
        make_layer(
            f"detection_evaluate_param {{ {snippet} }}",
            shapes or [(1, 1, 5, 7), (1, 1, 2, 8)],
            type="DetectionEvaluate",
        )


def test_error_name_size_file_unsupported():
    with pytest.raises(UnsupportedError, match=r"\(DetectionEvaluate\): name_size_file"):
        make_layer(
            "detection_evaluate_param { num_classes: 3 name_size_file: 'sizes.txt' }",
            [(1, 1, 5, 7), (1, 1, 2, 8)],
            type="DetectionEvaluate",
        )


@pytest.mark.parametrize("which", ["detections", "ground truth"])
def test_error_background_label_in_data(which):
    det, gt = make_data(np.random.default_rng(0))
    if which == "detections":
        det[0, 0, 0, :2] = [0, 0]
    else:
        gt[0, 0, 0, :2] = [0, 0]
    with pytest.raises(DataError, match=rf"found background label in the {which}"):
        _run("num_classes: 4", det, gt)


def test_error_placeholder_row_with_background_minus_one():
    det, gt = make_data(np.random.default_rng(0))
    with pytest.raises(DataError, match=r"background label in the detections.*-1"):
        _run("num_classes: 4 background_label_id: 4294967295", det, gt)
