"""Proposal against numpy ports of its two references.

- The fork's ``Proposal`` (brocolli-caffe 9.0.2 proposal_layer.cpp + util/nms.cpp): its
  anchors, transform_box (decode, clip, min_size zeroing the score), the partial quicksort,
  nms_cpu with its disjoint early exit, every image reading im_info row 0.
- py-faster-rcnn's ``rpn.proposal_layer.ProposalLayer`` (served natively for ``type:
  "Python"``): generate_anchors, bbox_transform_inv, clip_boxes, _filter_boxes with min_size
  in scaled image units, argsort()[::-1], gpu_nms (IoU > thresh), cfg by phase, batch index 0.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError, LayerParamError
from torchcaffe.ops._python_substitutes import NativeSubstituteWarning
from torchcaffe.ops.proposal import fork_sort_order, greedy_nms

f32 = np.float32
FORK = (
    "proposal_param { feat_stride: 16 base_size: 16 min_size: 8 ratio: 0.5 ratio: 1 "
    "ratio: 2 scale: 8 scale: 16 pre_nms_topn: 60 post_nms_topn: 12 nms_thresh: 0.7 }"
)
RPN = (
    "python_param { module: 'rpn.proposal_layer' layer: 'ProposalLayer' "
    "param_str: \"'feat_stride': 16, 'scales': [1, 2]\" }"
)


def make_bottoms(gen, n=2, a=6, h=4, w=5, im_info=(61.0, 77.0, 1.0)):
    """Scores in (0, 1) (distinct), deltas wide enough to clip and to shrink boxes."""
    scores = torch.rand((n, 2 * a, h, w), generator=gen)
    deltas = torch.randn((n, 4 * a, h, w), generator=gen) * 0.6
    return [scores, deltas, torch.tensor([im_info], dtype=torch.float32)]


CASES = [
    LayerCase(
        "Proposal",
        FORK,
        [(2, 12, 4, 5), (2, 24, 4, 5), (1, 3)],
        n_tops=2,
        phase="TEST",
        make_bottoms=make_bottoms,
    ),
    LayerCase(
        "Python",
        RPN,
        [(1, 12, 4, 5), (1, 24, 4, 5), (1, 3)],
        n_tops=2,
        phase="TEST",
        make_bottoms=lambda gen: make_bottoms(gen, n=1, im_info=(61.0, 77.0, 0.5)),
    ),
]


# -- the fork ----------------------------------------------------------------------------------
def fork_anchors(base, ratios, scales):
    """generate_anchors in proposal_layer.cpp (float math; ROUND is (int)(x + 0.5))."""
    center = f32(0.5) * (f32(base) - f32(1))
    out = []
    for r in ratios:
        rw = f32(np.sqrt(f32(base * base) / f32(r)))
        rh = f32(rw * f32(r))
        for s in scales:
            sw = f32(0.5) * int(float(f32(rw * f32(s))) / base - 1.0 + 0.5)
            sh = f32(0.5) * int(float(f32(rh * f32(s))) / base - 1.0 + 0.5)
            out.append([center - sw, center - sh, center + sw, center + sh])
    return np.array(out, f32)


def fork_sort(rows, start, end, num_top):
    """sort_box: descending partial quicksort (first element as pivot), in place."""
    pivot = rows[start, 4]
    left, right = start + 1, end
    while left <= right:
        while left <= end and rows[left, 4] >= pivot:
            left += 1
        while right > start and rows[right, 4] <= pivot:
            right -= 1
        if left <= right:
            rows[[left, right]] = rows[[right, left]]
            left, right = left + 1, right - 1
    if right > start:
        rows[[start, right]] = rows[[right, start]]
    if start < right - 1:
        fork_sort(rows, start, right - 1, num_top)
    if right + 1 < num_top and right + 1 < end:
        fork_sort(rows, right + 1, end, num_top)


def fork_iou(a, b):
    if a[0] > b[2] or a[1] > b[3] or a[2] < b[0] or a[3] < b[1]:
        return f32(0)
    w = max(f32(0), min(a[2], b[2]) - max(a[0], b[0]) + f32(1))
    h = max(f32(0), min(a[3], b[3]) - max(a[1], b[1]) + f32(1))
    area_a = (a[2] - a[0] + f32(1)) * (a[3] - a[1] + f32(1))
    area_b = (b[2] - b[0] + f32(1)) * (b[3] - b[1] + f32(1))
    return w * h / (area_a + area_b - w * h)


def ref_fork(scores, deltas, im_info, p):
    """Forward_cpu per image: enumerate, sort_box, nms_cpu, retrieve -> (rois, scores)."""
    anchors = fork_anchors(p["base_size"], p["ratio"], p["scale"])
    a = len(anchors)
    img_h, img_w = f32(im_info[0, 0]), f32(im_info[0, 1])
    rois, kept = [], []
    for n in range(scores.shape[0]):
        rows = []
        for y, x, k in np.ndindex(scores.shape[2], scores.shape[3], a):
            box = anchors[k] + f32([x * p["feat_stride"], y * p["feat_stride"]] * 2)
            dx, dy, dw, dh = deltas[n, 4 * k : 4 * k + 4, y, x]
            bw, bh = box[2] - box[0] + f32(1), box[3] - box[1] + f32(1)
            cx, cy = box[0] + f32(0.5) * bw, box[1] + f32(0.5) * bh
            px, py = dx * bw + cx, dy * bh + cy
            pw, ph = np.exp(dw) * bw, np.exp(dh) * bh
            box = f32(
                [px - f32(0.5) * pw, py - f32(0.5) * ph, px + f32(0.5) * pw, py + f32(0.5) * ph]
            )
            limit = f32([img_w, img_h, img_w, img_h]) - f32(1)
            box = np.maximum(f32(0), np.minimum(box, limit))
            big = (box[2] - box[0] + 1 >= p["min_size"]) and (box[3] - box[1] + 1 >= p["min_size"])
            rows.append([*box, f32(big) * scores[n, a + k, y, x]])
        rows = np.array(rows, f32)
        fork_sort(rows, 0, len(rows) - 1, p["pre_nms_topn"])
        rows = rows[: min(len(rows), p["pre_nms_topn"])]
        dead, keep = np.zeros(len(rows), bool), []
        for i in range(len(rows)):
            if dead[i]:
                continue
            keep.append(i)
            if len(keep) == p["post_nms_topn"]:
                break
            for j in range(i + 1, len(rows)):
                dead[j] |= fork_iou(rows[i], rows[j]) > f32(p["nms_thresh"])
        rois += [[n, *rows[i, :4]] for i in keep]
        kept += [rows[i, 4] for i in keep]
    return np.array(rois, f32).reshape(-1, 5), np.array(kept, f32)


def fork_param(**kw):
    p = dict(
        feat_stride=16,
        base_size=16,
        min_size=8,
        ratio=[0.5, 1, 2],
        scale=[8, 16],
        pre_nms_topn=60,
        post_nms_topn=12,
        nms_thresh=0.7,
    )
    p.update(kw)
    return p


def snippet_of(p):
    fields = " ".join(
        f"{k}: {v}" for k, vs in p.items() for v in (vs if isinstance(vs, list) else [vs])
    )
    return f"proposal_param {{ {fields} }}"


def test_fork_anchors():
    """Side ~ scale / sqrt(ratio) pixels: ratio 0.5, scale 8 -> 0.5 * (int)(10.31 + 0.5) = 5."""
    p = fork_param()
    layer, _ = make_layer(snippet_of(p), [(1, 12, 2, 3), (1, 24, 2, 3), (1, 3)], type="Proposal")
    assert layer.anchors[0].tolist() == [2.5, 5.0, 12.5, 10.0]
    np.testing.assert_array_equal(layer.anchors.numpy(), fork_anchors(16, [0.5, 1, 2], [8, 16]))


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"min_size": 2, "nms_thresh": 0.5},
        {"pre_nms_topn": 200, "post_nms_topn": 40, "nms_thresh": 0.9},
        {"feat_stride": 8, "base_size": 10, "ratio": [1.5], "scale": [20], "min_size": 16},
    ],
)
def test_fork_forward_matches_reference(kw):
    p = fork_param(**kw)
    a = len(p["ratio"]) * len(p["scale"])
    scores, deltas, im_info = make_bottoms(torch.Generator().manual_seed(4), a=a)
    layer, _ = make_layer(
        snippet_of(p),
        [scores.shape, deltas.shape, (1, 3)],
        type="Proposal",
        n_tops=2,
        bottoms=[scores, deltas, im_info],
    )
    rois, kept = layer(scores, deltas, im_info)
    want_rois, want_scores = ref_fork(scores.numpy(), deltas.numpy(), im_info.numpy(), p)
    np.testing.assert_allclose(rois.numpy(), want_rois, rtol=1e-6, atol=1e-4)
    np.testing.assert_array_equal(kept.numpy(), want_scores)
    assert layer.output_shapes([scores.shape, deltas.shape, (1, 3)]) == [
        (2 * p["post_nms_topn"], 5),
        (2 * p["post_nms_topn"],),
    ]


def test_fork_every_image_reads_im_info_row0_and_min_size_is_unscaled():
    scores, deltas, _ = make_bottoms(torch.Generator().manual_seed(6))
    im_info = torch.tensor([[40.0, 50.0, 4.0], [999.0, 999.0, 1.0]])
    layer, _ = make_layer(
        FORK,
        [scores.shape, deltas.shape, (2, 3)],
        type="Proposal",
        bottoms=[scores, deltas, im_info],
    )
    rois = layer(scores, deltas, im_info)
    assert set(rois[:, 0].tolist()) == {0.0, 1.0}
    assert rois[:, 1::2].max() <= 49 and rois[:, 2::2].max() <= 39
    want, _ = ref_fork(scores.numpy(), deltas.numpy(), im_info.numpy()[:1], fork_param())
    np.testing.assert_allclose(rois.numpy(), want, rtol=1e-6, atol=1e-4)


def test_fork_sort_order_replays_sort_box():
    """Tied scores leave the quicksort in its own, unstable order; the layer replays it."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(2, 40))
        keys = (rng.integers(0, int(rng.integers(1, 6)), n) / 4).astype(f32)
        top = int(rng.integers(0, n + 2))
        rows = np.zeros((n, 5), f32)
        rows[:, 0], rows[:, 4] = np.arange(n), keys
        fork_sort(rows, 0, n - 1, top)
        np.testing.assert_array_equal(fork_sort_order(keys, top), rows[:, 0].astype(int))
    assert fork_sort_order(f32([0.5, 0.5, 0.9, 0.5]), 4).tolist() == [2, 1, 0, 3]  # unstable


def test_fork_forward_with_tied_scores_matches_reference():
    """Half the scores tie (0.5) and many boxes fall under min_size (score 0)."""
    scores, deltas, im_info = make_bottoms(torch.Generator().manual_seed(7))
    scores[:, :, ::2] = 0.5
    p = fork_param(min_size=14, pre_nms_topn=70, post_nms_topn=30, nms_thresh=0.95)
    layer, _ = make_layer(
        snippet_of(p),
        [scores.shape, deltas.shape, (1, 3)],
        type="Proposal",
        n_tops=2,
        bottoms=[scores, deltas, im_info],
    )
    rois, kept = layer(scores, deltas, im_info)
    want_rois, want_scores = ref_fork(scores.numpy(), deltas.numpy(), im_info.numpy(), p)
    assert (want_scores == 0).sum() > 4 and (want_scores == 0.5).sum() > 4
    np.testing.assert_allclose(rois.numpy(), want_rois, rtol=1e-6, atol=1e-4)
    np.testing.assert_array_equal(kept.numpy(), want_scores)


@pytest.mark.parametrize("disjoint_zero,kept", [(True, [0, 1]), (False, [0])])
def test_nms_disjoint_early_exit(disjoint_zero, kept):
    """x1 of box 1 lies beyond x2 of box 0, yet the +1 widths overlap (IoU 0.9): only the
    fork's iou() returns 0 there; py-faster-rcnn's GPU kernel suppresses."""
    boxes = torch.tensor([[10.0, 0.0, 10.04, 10.0], [10.05, 0.0, 10.1, 10.0]])
    assert greedy_nms(boxes, 0.7, 10, disjoint_zero).tolist() == kept


def test_no_backward():
    layer, (scores, deltas, im_info) = CASES[0].build()
    scores.requires_grad_(True)
    rois, kept = layer(scores, deltas, im_info)
    assert not layer.has_backward and not rois.requires_grad and not kept.requires_grad


# -- py-faster-rcnn's Python layer ----------------------------------------------------------
def rpn_anchors(scales, ratios=(0.5, 1, 2), base=16):
    """generate_anchors.py: _ratio_enum then _scale_enum on the (0, 0, 15, 15) window."""

    def mk(ws, hs, cx, cy):
        return np.stack(
            [cx - 0.5 * (ws - 1), cy - 0.5 * (hs - 1), cx + 0.5 * (ws - 1), cy + 0.5 * (hs - 1)], 1
        )

    ws = np.round(np.sqrt(base * base / np.array(ratios, float)))
    ratio_anchors = mk(ws, np.round(ws * np.array(ratios)), 7.5, 7.5)
    out = []
    for r in ratio_anchors:
        w, h = r[2] - r[0] + 1, r[3] - r[1] + 1
        out.append(
            mk(
                w * np.array(scales),
                h * np.array(scales),
                r[0] + 0.5 * (w - 1),
                r[1] + 0.5 * (h - 1),
            )
        )
    return np.vstack(out)


def ref_rpn(scores, deltas, im_info, scales, cfg):
    """proposal_layer.py forward (argsort taken stable) with gpu_nms: -> (rois, scores)."""
    pre, post, thresh, min_size = cfg
    anchors = rpn_anchors(scales)
    a = len(anchors)
    h, w = scores.shape[-2:]
    sx, sy = np.meshgrid(np.arange(w) * 16, np.arange(h) * 16)
    shifts = np.stack([sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel()], 1)
    boxes = (anchors[None] + shifts[:, None]).reshape(-1, 4).astype(f32)
    d = deltas.transpose(0, 2, 3, 1).reshape(-1, 4)
    fg = scores[:, a:].transpose(0, 2, 3, 1).reshape(-1)
    widths, heights = boxes[:, 2] - boxes[:, 0] + 1.0, boxes[:, 3] - boxes[:, 1] + 1.0
    cx, cy = boxes[:, 0] + 0.5 * widths, boxes[:, 1] + 0.5 * heights
    px, py = d[:, 0] * widths + cx, d[:, 1] * heights + cy
    pw, ph = np.exp(d[:, 2]) * widths, np.exp(d[:, 3]) * heights
    props = np.stack([px - 0.5 * pw, py - 0.5 * ph, px + 0.5 * pw, py + 0.5 * ph], 1)
    info = im_info[0]
    props = np.maximum(np.minimum(props, info[[1, 0, 1, 0]] - 1), 0)
    ok = (props[:, 2] - props[:, 0] + 1 >= min_size * info[2]) & (
        props[:, 3] - props[:, 1] + 1 >= min_size * info[2]
    )
    props, fg = props[ok], fg[ok]
    order = fg.argsort(kind="stable")[::-1][:pre]
    props, fg = props[order], fg[order]
    order = fg.argsort(kind="stable")[::-1]  # gpu_nms sorts again
    keep, dead = [], np.zeros(len(order), bool)
    for i, oi in enumerate(order):
        if dead[i]:
            continue
        keep.append(oi)
        for j in range(i + 1, len(order)):
            b, c = props[oi], props[order[j]]
            iw = max(min(b[2], c[2]) - max(b[0], c[0]) + 1, f32(0))
            ih = max(min(b[3], c[3]) - max(b[1], c[1]) + 1, f32(0))
            area = lambda r: (r[2] - r[0] + 1) * (r[3] - r[1] + 1)  # noqa: E731
            dead[j] |= iw * ih / (area(b) + area(c) - iw * ih) > f32(thresh)
    keep = keep[:post]
    rois = np.hstack([np.zeros((len(keep), 1), f32), props[keep]])
    return rois, fg[keep][:, None]


def test_rpn_anchors_are_generate_anchors():
    """The table generate_anchors.py prints for scales (8, 16, 32), ratios (0.5, 1, 2)."""
    with pytest.warns(NativeSubstituteWarning):
        layer, _ = make_layer(
            RPN.replace("'scales': [1, 2]", "'scales': (8, 16, 32)"),
            [(1, 18, 2, 3), (1, 36, 2, 3), (1, 3)],
            type="Python",
        )
    np.testing.assert_array_equal(
        layer.anchors.numpy(),
        [
            [-84, -40, 99, 55],
            [-176, -88, 191, 103],
            [-360, -184, 375, 199],
            [-56, -56, 71, 71],
            [-120, -120, 135, 135],
            [-248, -248, 263, 263],
            [-36, -80, 51, 95],
            [-80, -168, 95, 183],
            [-168, -344, 183, 359],
        ],
    )
    np.testing.assert_array_equal(rpn_anchors((8, 16, 32)), layer.anchors.numpy())


@pytest.mark.parametrize(
    "phase,cfg", [("TEST", (6000, 300, 0.7, 16)), ("TRAIN", (12000, 2000, 0.7, 16))]
)
@pytest.mark.parametrize("im_scale", [0.5, 1.0, 1.6])
def test_rpn_forward_matches_reference(phase, cfg, im_scale):
    """min_size counts in scaled image pixels (16 * im_info[2]); batch index 0; scores K x 1."""
    scores, deltas, im_info = make_bottoms(
        torch.Generator().manual_seed(8), n=1, h=6, w=7, im_info=(90.0, 101.0, im_scale)
    )
    deltas[0, 2::4] -= 1.0  # shrink many boxes towards min_size
    with pytest.warns(NativeSubstituteWarning, match=f"cfg.{phase}"):
        layer, _ = make_layer(
            RPN, [scores.shape, deltas.shape, (1, 3)], type="Python", n_tops=2, phase=phase
        )
    rois, kept = layer(scores, deltas, im_info)
    want_rois, want_scores = ref_rpn(scores.numpy(), deltas.numpy(), im_info.numpy(), (1, 2), cfg)
    np.testing.assert_allclose(rois.numpy(), want_rois, rtol=1e-6, atol=1e-4)
    np.testing.assert_array_equal(kept.numpy(), want_scores)
    assert 0 < len(rois) < 6 * 7 * 6 and not rois[:, 0].any()
    assert layer.output_shapes([scores.shape, deltas.shape, (1, 3)]) == [(1, 5), (1, 1, 1, 1)]


def test_rpn_post_nms_top_n_cuts():
    scores, deltas, im_info = make_bottoms(
        torch.Generator().manual_seed(9), n=1, h=30, w=30, im_info=(480.0, 480.0, 1.0)
    )
    with pytest.warns(NativeSubstituteWarning):
        layer, _ = make_layer(
            RPN, [scores.shape, deltas.shape, (1, 3)], type="Python", phase="TEST"
        )
    assert layer(scores, deltas, im_info).shape == (300, 5)


# -- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "snippet,shapes,match",
    [
        ("proposal_param { scale: 8 }", None, "at least one ratio and one scale"),
        ("proposal_param { ratio: 1 }", None, "at least one ratio and one scale"),
        ("proposal_param { ratio: 0 scale: 8 }", None, "every ratio must be > 0"),
        ("proposal_param { ratio: 1 scale: -8 }", None, "every scale must be > 0"),
        ("proposal_param { ratio: 1 scale: 8 feat_stride: 0 }", None, "feat_stride must be > 0"),
        (
            "proposal_param { ratio: 1 scale: 8 post_nms_topn: 0 }",
            None,
            "post_nms_topn must be > 0",
        ),
        (
            "proposal_param { ratio: 1 scale: 8 }",
            [(1, 4, 3, 3), (1, 4, 3, 3), (1, 3)],
            r"background and foreground.*1 anchors",
        ),
        (
            "proposal_param { ratio: 1 scale: 8 }",
            [(1, 2, 3, 3), (1, 4, 3, 4), (1, 3)],
            "4 box deltas per anchor",
        ),
        (
            "proposal_param { ratio: 1 scale: 8 }",
            [(1, 2, 3, 3), (1, 4, 3, 3), (1, 1)],
            "im_info rows",
        ),
    ],
)
def test_error(snippet, shapes, match):
    shapes = shapes or [(1, 2, 3, 3), (1, 4, 3, 3), (1, 3)]
    with pytest.raises(LayerParamError, match=rf"layer 'p1' \(Proposal\).*{match}"):
        make_layer(snippet, shapes, type="Proposal", name="p1")


def test_error_bottom_count():
    with pytest.raises(BlobWiringError, match=r"layer 'p1' \(Proposal\).*exactly 3 bottom"):
        make_layer(FORK, [(1, 12, 3, 3), (1, 24, 3, 3)], type="Proposal", name="p1")


def test_rpn_error_batch_of_two():
    with pytest.raises(LayerParamError, match=r"layer 'p1' \(Python\).*single item batches"):
        make_layer(RPN, [(2, 12, 3, 3), (2, 24, 3, 3), (1, 3)], type="Python", name="p1")


def test_rpn_error_im_info_needs_scale():
    with pytest.raises(LayerParamError, match=r"layer 'p1' \(Python\).*im_info.*1 x 3"):
        make_layer(RPN, [(1, 12, 3, 3), (1, 24, 3, 3), (1, 2)], type="Python", name="p1")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_fork_forward_is_the_float_one_rounded(dtype):
    """A .half() / .bfloat16() net: boxes decoded and selected in float32 (bfloat16 scores
    tie often, which took the host replay of sort_box, with no bfloat16 numpy)."""
    scores, deltas, im_info = make_bottoms(torch.Generator().manual_seed(4))
    scores, deltas = scores.to(dtype), deltas.to(dtype)
    shapes = [scores.shape, deltas.shape, (1, 3)]
    bottoms = [scores, deltas, im_info]
    layer, _ = make_layer(FORK, shapes, type="Proposal", n_tops=2, bottoms=bottoms, dtype=dtype)
    rois, kept = layer(scores, deltas, im_info)
    want_rois, want_scores = layer.float()(scores.float(), deltas.float(), im_info)
    assert rois.dtype == kept.dtype == dtype
    torch.testing.assert_close(rois, want_rois.to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(kept, want_scores.to(dtype), rtol=0, atol=0)
