"""MultiBoxLoss (SSD fork): matching (bipartite + per-prediction, per class, decoded loc,
cross-boundary), MAX_NEGATIVE and HARD_EXAMPLE mining, SmoothL1/L2 and softmax/logistic
losses, normalization, the fork's gradients (variance in target, bp_inside), errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import ssd_reference as ref
from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import DataError, LayerParamError, UnsupportedError

N, P, C = 2, 30, 4
FLT_MIN = float(np.finfo(np.float32).tiny)


def make_data(rng, loc_classes=1, labels=(1, 2, 3)):
    """loc, conf, priors and labels (1, 1, G, 8): each gt a jittered prior (so that it matches)
    or a random box, one difficult, one row of image -1."""
    prior = ref.random_priors(rng, P)
    boxes = prior[0, 0].reshape(P, 4)
    gt = []
    for i in range(N):
        for k in range(3 - i):
            box = (
                boxes[rng.integers(P)] + rng.normal(0, 0.02, 4)
                if k < 2
                else np.concatenate([c := rng.uniform(0.3, 0.7, 2), c + 0.25])
            )
            gt.append([i, rng.choice(labels), k, *box, float(k == 1 and i == 1)])
    gt.insert(1, [-1, 1, 0, 0.1, 0.1, 0.2, 0.2, 0])
    loc = rng.normal(0, 0.7, size=(N, P * loc_classes * 4))
    conf = rng.normal(0, 1.5, size=(N, P * C))
    return loc, conf, prior, np.array(gt)[None, None]


def _bottoms(loc_classes=1):
    def make(g):
        rng = np.random.default_rng(int(torch.randint(1 << 30, (1,), generator=g)))
        return [torch.tensor(a) for a in make_data(rng, loc_classes)]

    return make


SHAPES = ((N, P * 4), (N, P * C), (1, 2, P * 4), (1, 1, 6, 8))
CASES = [
    LayerCase(
        "MultiBoxLoss",
        "multibox_loss_param { num_classes: 4 code_type: CENTER_SIZE } "
        "loss_param { normalization: VALID }",
        SHAPES,
        make_bottoms=_bottoms(),
        id="multibox_max_negative",
    ),
    LayerCase(
        "MultiBoxLoss",
        "multibox_loss_param { num_classes: 4 share_location: false "
        "mining_type: NONE conf_loss_type: LOGISTIC loc_loss_type: L2 }",
        ((N, P * C * 4),) + SHAPES[1:],
        make_bottoms=_bottoms(C),
        id="multibox_per_class",
    ),
    LayerCase(
        "MultiBoxLoss",
        "multibox_loss_param { num_classes: 4 mining_type: HARD_EXAMPLE "
        "sample_size: 12 code_type: CORNER_SIZE loc_weight: 2 } loss_param { "
        "normalization: BATCH_SIZE }",
        SHAPES,
        make_bottoms=_bottoms(),
        id="multibox_hard_example",
    ),
]


# -- the fork's Forward/Backward, one box at a time ----------------------------------------
def ref_match(gts, preds, label, per_prediction, threshold, ignore_cross):
    """MatchBBox -> (indices, overlaps) over the predictions."""
    idx = [i for i, g in enumerate(gts) if label == -1 or g[0] == label]
    match, best = [-1] * len(preds), [0.0] * len(preds)
    if not idx:
        return match, best
    ov = {}
    for i, p in enumerate(preds):
        if ignore_cross and (np.any(p < 0) or np.any(p > 1)):
            match[i] = -2
            continue
        for j, g in enumerate(idx):
            o = ref.jaccard(p, gts[g][1])
            if o > 1e-6:
                best[i], ov[i, j] = max(best[i], o), o
    pool = list(range(len(idx)))
    while pool:
        top = max(
            ((o, i, j) for (i, j), o in ov.items() if match[i] == -1 and j in pool),
            default=None,
            key=lambda t: (t[0], -t[1], -t[2]),
        )
        if top is None:
            break
        o, i, j = top
        match[i], best[i] = idx[j], o
        pool.remove(j)
    if per_prediction:
        for i in range(len(preds)):
            cands = [(o, j) for (ii, j), o in ov.items() if ii == i and o >= threshold]
            if match[i] == -1 and cands:
                o, j = max(cands, key=lambda t: (t[0], -t[1]))
                match[i], best[i] = idx[j], o
    return match, best


def onehot(label, num_classes):
    return np.array([float(c == label) for c in range(num_classes)])


def ref_conf_loss_row(x, label, softmax):
    """(loss, d loss / d x) of one prior's scores; the softmax gradient ignores the clamp."""
    if softmax:
        prob = ref.softmax(x)
        onehot = np.eye(len(x))[label]
        return -np.log(max(prob[label], FLT_MIN)), prob - onehot
    t = np.asarray(label, dtype=np.float64)  # a full target row
    return (np.maximum(x, 0) - x * t + np.log1p(np.exp(-abs(x)))).sum(), 1 / (1 + np.exp(-x)) - t


def ref_multibox_loss(
    loc,
    conf,
    prior,
    label,
    num_classes=C,
    share_location=True,
    background=0,
    per_prediction=True,
    overlap_threshold=0.5,
    use_prior_for_matching=True,
    use_difficult_gt=True,
    mining="MAX_NEGATIVE",
    neg_pos_ratio=3.0,
    neg_overlap=0.5,
    sample_size=64,
    code_type=ref.CORNER,
    var_in_target=False,
    l2=False,
    softmax=True,
    loc_weight=1.0,
    normalization="VALID",
    bp_inside=False,
    ignore_cross=False,
    agnostic=False,
):
    """-> (loss, d loss / d loc, d loss / d conf) as the fork's Forward_cpu / Backward_cpu."""
    num, p = loc.shape[0], prior.shape[2] // 4
    pbox, pvar = prior[0, 0].reshape(p, 4), prior[0, 1].reshape(p, 4)
    nloc = 1 if share_location else num_classes
    loc_r, conf_r = loc.reshape(num, p, nloc, 4), conf.reshape(num, p, num_classes)
    gts = {}
    for row in label.reshape(-1, 8):
        if int(row[0]) != -1 and (use_difficult_gt or not row[7]):
            gts.setdefault(int(row[0]), []).append((int(row[1]), row[3:7]))
    keys = [-1] if share_location else [c for c in range(num_classes) if c != background]
    match = [{} for _ in range(num)]
    over = [{} for _ in range(num)]
    for i in range(num):
        if i not in gts:
            continue
        for key in keys:
            if use_prior_for_matching:
                m, o = ref_match(gts[i], pbox, -1, per_prediction, overlap_threshold, ignore_cross)
                if key != -1:
                    m = [g if g > -1 and gts[i][g][0] == key else -1 for g in m]
            else:
                preds = [
                    ref.decode(pbox[j], pvar[j], loc_r[i, j, max(key, 0)], code_type, var_in_target)
                    for j in range(p)
                ]
                m, o = ref_match(
                    gts[i], preds, key, per_prediction, overlap_threshold, ignore_cross
                )
            match[i][key], over[i][key] = m, o

    def encode_pairs():
        pairs = []  # (i, j, col, pred, target)
        for i in range(num):
            for key in sorted(match[i]):
                for j, g in enumerate(match[i][key]):
                    if g <= -1:
                        continue
                    target = ref.encode(pbox[j], pvar[j], gts[i][g][1], code_type, var_in_target)
                    pred = loc_r[i, j, max(key, 0)].copy()
                    if bp_inside:
                        box = (
                            pbox[j]
                            if use_prior_for_matching
                            else ref.decode(pbox[j], pvar[j], pred, code_type, var_in_target)
                        )
                        pred = np.where((box < 0) | (box > 1), target, pred)
                    if var_in_target:
                        pred, target = pred / pvar[j], target / pvar[j]
                    pairs.append((i, j, max(key, 0), pred, target))
        return pairs

    def loc_terms(d):
        if l2:
            return 0.5 * d * d, d
        return np.where(abs(d) < 1, 0.5 * d * d, abs(d) - 0.5), np.where(abs(d) < 1, d, np.sign(d))

    pairs = encode_pairs()
    negs = [[] for _ in range(num)]
    if mining != "NONE":
        for i in range(num):
            if not match[i]:
                continue
            m = match[i][-1]
            labels = [gts[i][g][0] if g > -1 else background for g in m]
            loss = [
                float(ref_conf_loss_row(conf_r[i, j], labels[j], True)[0])
                if softmax
                else float(
                    ref_conf_loss_row(conf_r[i, j], onehot(labels[j], num_classes), False)[0]
                )
                for j in range(p)
            ]
            if mining == "HARD_EXAMPLE":
                for ii, j, _, pred, target in pairs:
                    if ii == i:
                        loss[j] += float(loc_terms(pred - target)[0].sum())
                eligible = list(range(p))
                n_sel = min(sample_size, p)
            else:
                eligible = [j for j in range(p) if m[j] == -1 and over[i][-1][j] < neg_overlap]
                n_pos = sum(g > -1 for g in m)
                n_sel = min(int(np.float32(n_pos) * np.float32(neg_pos_ratio)), len(eligible))
            chosen = set(sorted(eligible, key=lambda j: -loss[j])[:n_sel])
            for j in range(p):
                if m[j] > -1 and mining == "HARD_EXAMPLE" and j not in chosen:
                    m[j] = -1
                elif m[j] == -1 and j in chosen:
                    negs[i].append(j)
        pairs = encode_pairs()
    num_matches = sum(g > -1 for i in range(num) for m in match[i].values() for g in m)
    norm = max(
        1.0, {"VALID": num_matches, "FULL": num * p, "BATCH_SIZE": num, "NONE": 1}[normalization]
    )
    dloc, dconf = np.zeros_like(loc_r), np.zeros_like(conf_r)
    loc_loss = 0.0
    for i, j, col, pred, target in pairs:
        value, grad = loc_terms(pred - target)
        loc_loss += value.sum()
        dloc[i, j, col] = loc_weight * grad / norm  # copied, not divided by the variance
    conf_loss = 0.0

    def target_label(i, g):
        return background + 1 if agnostic else gts[i][g][0]

    if mining != "NONE":
        for i in range(num):
            rows = [(j, target_label(i, g)) for j, g in enumerate(match[i].get(-1, [])) if g > -1]
            rows += [(j, background) for j in negs[i]]
            for j, lab in rows:
                if softmax:
                    value, grad = ref_conf_loss_row(conf_r[i, j], lab, True)
                else:
                    t = np.full(num_classes, float(background))
                    if 0 <= lab < num_classes:
                        t[lab] = 1.0
                    value, grad = ref_conf_loss_row(conf_r[i, j], t, False)
                conf_loss += value
                dconf[i, j] = grad / norm
    elif softmax:
        for i in range(num):
            for j in range(p):
                lab = background
                for key in sorted(match[i]):
                    if match[i][key][j] > -1:
                        lab = target_label(i, match[i][key][j])
                value, grad = ref_conf_loss_row(conf_r[i, j], lab, True)
                conf_loss += value
                dconf[i, j] = grad / norm
    else:
        t = np.full(num * p * num_classes, float(background))
        for i in range(num):
            for key in sorted(match[i]):
                for j, g in enumerate(match[i][key]):
                    if g > -1:  # the fork's per-image target stride is P, not P * C
                        t[i * p + j * num_classes + target_label(i, g)] = 1.0
        value, grad = ref_conf_loss_row(conf_r.reshape(-1), t, False)
        conf_loss, dconf = value, (grad / norm).reshape(dconf.shape)
    loss = loc_weight * loc_loss / norm + conf_loss / norm
    return loss, dloc.reshape(loc.shape), dconf.reshape(conf.shape)


def _layer(snippet, bottoms, dtype=torch.float64):
    layer, _ = make_layer(
        snippet, [tuple(b.shape) for b in bottoms], type="MultiBoxLoss", dtype=dtype
    )
    return layer


def _loss_and_grads(snippet, bottoms):
    xs = [b.clone().requires_grad_(i < 2) for i, b in enumerate(bottoms)]
    loss = _layer(snippet, bottoms)(*xs)
    loss.backward()
    return loss.detach(), xs[0].grad, xs[1].grad


CONFIGS = [
    ("code_type: CENTER_SIZE", dict(code_type=ref.CENTER_SIZE), 1),
    (
        "share_location: false mining_type: NONE conf_loss_type: LOGISTIC loc_loss_type: L2",
        dict(share_location=False, mining="NONE", softmax=False, l2=True),
        C,
    ),
    (
        "mining_type: HARD_EXAMPLE sample_size: 12 code_type: CORNER_SIZE loc_weight: 2 } "
        "loss_param { normalization: BATCH_SIZE",
        dict(
            mining="HARD_EXAMPLE",
            sample_size=12,
            code_type=ref.CORNER_SIZE,
            loc_weight=2.0,
            normalization="BATCH_SIZE",
        ),
        1,
    ),
    (
        "share_location: false use_prior_for_matching: false mining_type: NONE match_type: "
        "BIPARTITE code_type: CENTER_SIZE",
        dict(
            share_location=False,
            mining="NONE",
            use_prior_for_matching=False,
            per_prediction=False,
            code_type=ref.CENTER_SIZE,
        ),
        C,
    ),
    (
        "use_prior_for_matching: false overlap_threshold: 0.3 code_type: CENTER_SIZE "
        "neg_pos_ratio: 2",
        dict(
            use_prior_for_matching=False,
            overlap_threshold=0.3,
            code_type=ref.CENTER_SIZE,
            neg_pos_ratio=2.0,
        ),
        1,
    ),
    (
        "encode_variance_in_target: true bp_inside: true code_type: CENTER_SIZE neg_overlap: 0.3 "
        "} loss_param { normalization: FULL",
        dict(
            var_in_target=True,
            bp_inside=True,
            code_type=ref.CENTER_SIZE,
            neg_overlap=0.3,
            normalization="FULL",
        ),
        1,
    ),
    (
        "use_prior_for_matching: false bp_inside: true code_type: CORNER_SIZE",
        dict(use_prior_for_matching=False, bp_inside=True, code_type=ref.CORNER_SIZE),
        1,
    ),
    (
        "ignore_cross_boundary_bbox: true use_difficult_gt: false overlap_threshold: 0.3 "
        "mining_type: HARD_EXAMPLE sample_size: 40 } loss_param { normalization: NONE",
        dict(
            ignore_cross=True,
            use_difficult_gt=False,
            overlap_threshold=0.3,
            mining="HARD_EXAMPLE",
            sample_size=40,
            normalization="NONE",
        ),
        1,
    ),
    ("conf_loss_type: LOGISTIC neg_pos_ratio: 1.5", dict(softmax=False, neg_pos_ratio=1.5), 1),
    (
        "conf_loss_type: LOGISTIC background_label_id: 4294967295 mining_type: NONE",
        dict(softmax=False, background=-1, mining="NONE"),
        1,
    ),
    (
        "share_location: false use_prior_for_matching: false mining_type: NONE conf_loss_type: "
        "LOGISTIC code_type: CENTER_SIZE overlap_threshold: 0.2",
        dict(
            share_location=False,
            use_prior_for_matching=False,
            mining="NONE",
            softmax=False,
            code_type=ref.CENTER_SIZE,
            overlap_threshold=0.2,
        ),
        C,
    ),
    (
        "share_location: false mining_type: NONE background_label_id: 3 code_type: CORNER_SIZE",
        dict(share_location=False, mining="NONE", background=3, code_type=ref.CORNER_SIZE),
        C,
    ),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("snippet,kw,loc_classes", CONFIGS, ids=range(len(CONFIGS)))
def test_forward_backward_match_reference(snippet, kw, loc_classes, seed):
    labels = (0, 1, 2) if kw.get("background") == 3 else (1, 2, 3)
    data = make_data(np.random.default_rng(seed), loc_classes, labels)
    loss, dloc, dconf = _loss_and_grads(
        f"multibox_loss_param {{ num_classes: 4 {snippet} }}", [torch.tensor(a) for a in data]
    )
    want, want_dloc, want_dconf = ref_multibox_loss(*data, **kw)
    assert want > 0 and np.abs(want_dloc).sum() > 0
    np.testing.assert_allclose(float(loss), want, rtol=1e-10)
    np.testing.assert_allclose(dloc.numpy(), want_dloc, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dconf.numpy(), want_dconf, rtol=1e-9, atol=1e-12)


def test_prior_count_follows_a_reshape():
    """The fork's Reshape recounts the priors: a layer set up for fewer priors takes the
    count (and the FULL normalizer) from the bottoms it is given."""
    data = make_data(np.random.default_rng(7), 1, (1, 2, 3))
    few = 20
    layer, _ = make_layer(
        "multibox_loss_param { num_classes: 4 } loss_param { normalization: FULL }",
        ((N, few * 4), (N, few * C), (1, 2, few * 4), data[3].shape),
        type="MultiBoxLoss",
        dtype=torch.float64,
    )
    xs = [torch.tensor(a).requires_grad_(i < 2) for i, a in enumerate(data)]
    loss = layer(*xs)
    loss.backward()
    want, want_dloc, want_dconf = ref_multibox_loss(*data, normalization="FULL")
    np.testing.assert_allclose(float(loss), want, rtol=1e-10)
    np.testing.assert_allclose(xs[0].grad.numpy(), want_dloc, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(xs[1].grad.numpy(), want_dconf, rtol=1e-9, atol=1e-12)


def test_map_object_to_agnostic():
    rng = np.random.default_rng(3)
    loc, conf, prior, label = make_data(rng)
    conf = conf.reshape(N, P, C)[..., :2].reshape(N, -1)
    data = [torch.tensor(a) for a in (loc, conf, prior, label)]
    snippet = "multibox_loss_param { num_classes: 2 map_object_to_agnostic: true %s }"
    loss, dloc, dconf = _loss_and_grads(snippet % "mining_type: NONE", data)
    want = ref_multibox_loss(loc, conf, prior, label, num_classes=2, mining="NONE", agnostic=True)
    np.testing.assert_allclose(float(loss), want[0], rtol=1e-10)
    np.testing.assert_allclose(dconf.numpy(), want[2], rtol=1e-9, atol=1e-12)
    with pytest.raises(DataError, match=r"matched ground truth label out of range"):
        _loss_and_grads(snippet % "", data)  # mining ranks with the real labels (< 2)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0, 1], max_points=50, step=1e-3)


def test_encode_variance_in_target_gradient_is_not_divided_by_the_variance():
    """The fork copies the diff of loc / var into loc's diff: analytic = numeric * var."""
    data = [torch.tensor(a) for a in make_data(np.random.default_rng(0))]
    layer = _layer(
        "multibox_loss_param { num_classes: 4 code_type: CORNER mining_type: NONE "
        "encode_variance_in_target: true }",
        data,
    )
    _, analytic, _ = _loss_and_grads(
        "multibox_loss_param { num_classes: 4 code_type: CORNER "
        "mining_type: NONE encode_variance_in_target: true }",
        data,
    )
    var = data[2][0, 1].reshape(1, P, 4).expand(N, P, 4).reshape(-1)
    for k in torch.nonzero(analytic.reshape(-1))[:8, 0].tolist():
        loc = data[0].clone().reshape(-1)
        loc[k] += 1e-6
        up = float(layer(loc.reshape(N, -1), *data[1:]))
        loc[k] -= 2e-6
        down = float(layer(loc.reshape(N, -1), *data[1:]))
        numeric = (up - down) / 2e-6
        assert float(analytic.reshape(-1)[k]) == pytest.approx(numeric * float(var[k]), rel=1e-5)


def test_propagate_down_leaves_a_term_out():
    data = [torch.tensor(a) for a in make_data(np.random.default_rng(1))]
    snippet = (
        "multibox_loss_param { num_classes: 4 } propagate_down: %s propagate_down: %s "
        "propagate_down: false propagate_down: false"
    )
    both = float(_layer(snippet % ("true", "true"), data)(*data))
    loc_only = float(_layer(snippet % ("true", "false"), data)(*data))
    conf_only = float(_layer(snippet % ("false", "true"), data)(*data))
    assert loc_only > 0 and conf_only > 0
    assert both == pytest.approx(loc_only + conf_only, rel=1e-12)


def test_no_ground_truth():
    loc, conf, prior, _ = make_data(np.random.default_rng(2))
    label = np.full((1, 1, 1, 8), -1.0)
    data = [torch.tensor(a) for a in (loc, conf, prior, label)]
    loss, dloc, dconf = _loss_and_grads("multibox_loss_param { num_classes: 4 }", data)
    assert float(loss) == 0 and not dloc.any() and not dconf.any()
    loss, _, _ = _loss_and_grads("multibox_loss_param { num_classes: 4 mining_type: NONE }", data)
    want = ref_multibox_loss(loc, conf, prior, label, mining="NONE")[0]
    np.testing.assert_allclose(float(loss), want, rtol=1e-12)


def test_flags_and_repr():
    layer = _layer(
        "multibox_loss_param { num_classes: 4 } loss_param { normalization: FULL }",
        [torch.zeros(s) for s in SHAPES],
    )
    assert layer.is_loss and layer.has_backward
    assert [layer.allow_force_backward(i) for i in range(4)] == [True, False, False, False]
    assert layer.output_shapes(SHAPES) == [()]
    assert "num_classes: 4" in repr(layer) and "normalization: FULL" in repr(layer)


@pytest.mark.parametrize(
    "snippet,shapes,match",
    [
        ("share_location: true", SHAPES, r"must provide num_classes"),
        (
            "num_classes: 4 background_label_id: 4",
            SHAPES,
            r"background_label_id should be within \[0, num_classes\) for Softmax",
        ),
        (
            "num_classes: 4 do_neg_mining: false",
            SHAPES,
            r"do_neg_mining \(deprecated\) contradicts",
        ),
        (
            "num_classes: 4 share_location: false",
            ((N, P * C * 4),) + SHAPES[1:],
            r"negative mining needs share_location: true",
        ),
        (
            "num_classes: 4 conf_loss_type: LOGISTIC background_label_id: 5",
            SHAPES,
            r"mining needs background_label_id < num_classes",
        ),
        (
            "num_classes: 4 mining_type: HARD_EXAMPLE sample_size: 0",
            SHAPES,
            r"HARD_EXAMPLE mining needs sample_size > 0",
        ),
        (
            "num_classes: 4 map_object_to_agnostic: true",
            SHAPES,
            r"map_object_to_agnostic needs one object class.*num_classes: 2, got 4",
        ),
        (
            "num_classes: 4",
            ((N, P * 4 + 4),) + SHAPES[1:],
            r"number of priors must match number of location predictions",
        ),
        ("num_classes: 5", SHAPES, r"number of priors must match number of confidence"),
        ("num_classes: 4", SHAPES[:3] + ((1, 6, 8),), r"bottom 3 \(labels\) must be"),
    ],
)
def test_error_bad_params_and_shapes(snippet, shapes, match):
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(MultiBoxLoss\): " + match):
        make_layer(f"multibox_loss_param {{ {snippet} }}", shapes, type="MultiBoxLoss")


def test_error_mining_with_nms_unsupported():
    with pytest.raises(UnsupportedError, match=r"\(MultiBoxLoss\): mining with nms_param"):
        make_layer(
            "multibox_loss_param { num_classes: 4 nms_param { nms_threshold: 0.5 } }",
            SHAPES,
            type="MultiBoxLoss",
        )


@pytest.mark.parametrize(
    "value,match",
    [
        (0, r"found background label in the ground truth"),
        (7, r"matched ground truth label out of range"),
    ],
)
def test_error_bad_labels_in_data(value, match):
    loc, conf, prior, label = make_data(np.random.default_rng(0))
    label[..., 1] = np.where(label[..., 0] >= 0, value, label[..., 1])
    data = [torch.tensor(a) for a in (loc, conf, prior, label)]
    with pytest.raises(DataError, match=r"\(MultiBoxLoss\): " + match):
        _layer("multibox_loss_param { num_classes: 4 }", data)(*data)


def test_error_degenerate_prior_when_matching_decoded_boxes():
    data = [torch.tensor(a) for a in make_data(np.random.default_rng(0))]
    data[2][0, 0, 2] = data[2][0, 0, 0]
    snippet = "multibox_loss_param { num_classes: 4 code_type: CENTER_SIZE %s }"
    _layer(snippet % "", data)(*data)  # priors matched directly: never decoded
    with pytest.raises(DataError, match=r"positive width and height.*prior 0"):
        _layer(snippet % "use_prior_for_matching: false", data)(*data)


def test_float32_center_size_encode_rounds_as_the_fork():
    """EncodeBBox's log is C's double log, divided by the variance in double and rounded
    once into the float target (a float log then a float division was a bit off)."""
    from torchcaffe.ops import _bbox

    rng = np.random.default_rng(2)
    prior = torch.from_numpy(ref.random_priors(rng, 256)[0, 0].reshape(-1, 4).astype(np.float32))
    gt = torch.from_numpy(ref.random_priors(rng, 256)[0, 0].reshape(-1, 4).astype(np.float32))
    var = torch.tensor([0.1, 0.1, 0.2, 0.2]).expand(256, 4)
    got = _bbox.encode(prior, var, gt, _bbox.CENTER_SIZE, False)[:, 2:].numpy()
    ratio = ((gt[:, 2:] - gt[:, :2]) / (prior[:, 2:] - prior[:, :2])).numpy()  # float division
    want = (np.log(ratio.astype(np.float64)) / np.float64(np.float32(0.2))).astype(np.float32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_loss_is_the_float_loss_rounded(dtype):
    """No mining, FULL normalization: the float16 sum over every prior would pass 65504."""
    rng = np.random.default_rng(3)
    loc, conf, prior, gt = (torch.tensor(a).to(dtype) for a in make_data(rng))
    conf = (conf * 30).repeat(1, 300)  # 9000 priors an image, confident misses
    loc, prior = loc.repeat(1, 300), prior.repeat(1, 1, 300)
    snippet = (
        "multibox_loss_param { num_classes: 4 mining_type: NONE } "
        "loss_param { normalization: FULL }"
    )
    bottoms = [loc, conf, prior, gt]
    shapes = [b.shape for b in bottoms]
    layer, _ = make_layer(snippet, shapes, type="MultiBoxLoss", bottoms=bottoms, dtype=dtype)
    ref_layer, _ = make_layer(snippet, shapes, type="MultiBoxLoss", bottoms=bottoms)
    x = conf.clone().requires_grad_(True)
    loss = layer(loc, x, prior, gt)
    want = ref_layer(*(b.float() for b in (loc, conf, prior, gt)))
    assert loss.dtype == dtype and torch.isfinite(want)
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(loss.float(), want, rtol=tol, atol=0)
    loss.backward()
    assert x.grad is not None and x.grad.dtype == dtype
