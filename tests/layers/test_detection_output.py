"""DetectionOutput (SSD fork): decoding per code type, per-class ApplyNMSFast (threshold,
top_k, adaptive eta), keep_top_k over all labels, the no-detection placeholder, no backward,
parameter and data errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import ssd_reference as ref
from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import DataError, LayerParamError, UnsupportedError

P, C = 24, 4


def _bottoms(num=2, loc_classes=1, seed=0):
    """loc (N, P*L*4), softmax conf (N, P*C), priors (1, 2, P*4), as float64 tensors."""

    def make(g):
        rng = np.random.default_rng(int(torch.randint(1 << 30, (1,), generator=g)) + seed)
        loc = rng.normal(0, 0.5, size=(num, P * loc_classes * 4))
        conf = ref.softmax(rng.normal(0, 1.5, size=(num, P, C))).reshape(num, -1)
        return [torch.tensor(a) for a in (loc, conf, ref.random_priors(rng, P))]

    return make


SHAPES = ((2, P * 4), (2, P * C), (1, 2, P * 4))
CASES = [
    LayerCase(
        "DetectionOutput",
        "detection_output_param { num_classes: 4 nms_param { "
        "nms_threshold: 0.45 top_k: 10 } keep_top_k: 6 confidence_threshold: 0.05 "
        "code_type: CENTER_SIZE }",
        SHAPES,
        make_bottoms=_bottoms(),
        phase="TEST",
        id="detout_ssd",
    ),
    LayerCase(
        "DetectionOutput",
        "detection_output_param { num_classes: 4 share_location: "
        "false background_label_id: -1 code_type: CORNER variance_encoded_in_target: "
        "true nms_param { nms_threshold: 0.3 } confidence_threshold: 0.2 }",
        ((2, P * C * 4),) + SHAPES[1:],
        make_bottoms=_bottoms(loc_classes=C),
        phase="TEST",
        id="detout_corner_nonshared",
    ),
]


def ref_nms_fast(boxes, scores, score_threshold, nms_threshold, eta, top_k):
    """ApplyNMSFast: stable descending candidates above the threshold, at most top_k; keep a
    box when it overlaps every kept one at most the (adaptive) threshold."""
    cand = sorted(
        [(s, j) for j, s in enumerate(scores) if s > score_threshold], key=lambda t: -t[0]
    )
    if -1 < top_k < len(cand):
        cand = cand[:top_k]
    kept, adaptive = [], nms_threshold
    for _, j in cand:
        keep = all(ref.jaccard(boxes[j], boxes[k]) <= adaptive for k in kept)
        if keep:
            kept.append(j)
            if eta < 1 and adaptive > 0.5:
                adaptive *= eta
    return kept


def ref_detection_output(
    loc,
    conf,
    prior,
    num_classes,
    share_location=True,
    background=0,
    nms_threshold=0.3,
    top_k=-1,
    keep_top_k=-1,
    threshold=-np.inf,
    code_type=ref.CORNER,
    var_in_target=False,
    eta=1.0,
):
    """The fork's Forward_cpu: rows [image, label, score, xmin, ymin, xmax, ymax]."""
    num, p = loc.shape[0], prior.shape[2] // 4
    pbox, pvar = prior[0, 0].reshape(p, 4), prior[0, 1].reshape(p, 4)
    nloc = 1 if share_location else num_classes
    loc, conf = loc.reshape(num, p, nloc, 4), conf.reshape(num, p, num_classes)
    rows = []
    for i in range(num):
        boxes = [
            [ref.decode(pbox[j], pvar[j], loc[i, j, c], code_type, var_in_target) for j in range(p)]
            for c in range(nloc)
        ]
        indices = {
            c: ref_nms_fast(
                boxes[0 if share_location else c],
                conf[i, :, c],
                threshold,
                nms_threshold,
                eta,
                top_k,
            )
            for c in range(num_classes)
            if c != background
        }
        if -1 < keep_top_k < sum(len(v) for v in indices.values()):
            pairs = sorted(
                [(conf[i, j, c], c, j) for c in sorted(indices) for j in indices[c]],
                key=lambda t: -t[0],
            )[:keep_top_k]
            indices = {}
            for _, c, j in pairs:
                indices.setdefault(c, []).append(j)
        for c in sorted(indices):
            for j in indices[c]:
                rows.append([i, c, conf[i, j, c], *boxes[0 if share_location else c][j]])
    if not rows:
        rows = [[i] + [-1] * 6 for i in range(num)]
    return np.array(rows, dtype=np.float64).reshape(1, 1, -1, 7)


def _run(snippet, bottoms, n_bottoms=3):
    layer, _ = make_layer(
        f"detection_output_param {{ {snippet} }}",
        [tuple(b.shape) for b in bottoms[:n_bottoms]],
        type="DetectionOutput",
        phase="TEST",
        dtype=torch.float64,
    )
    return layer(*bottoms[:n_bottoms])


@pytest.mark.parametrize(
    "snippet,kw,loc_classes",
    [
        (
            "num_classes: 4 nms_param { nms_threshold: 0.45 top_k: 10 } keep_top_k: 6 "
            "code_type: CENTER_SIZE confidence_threshold: 0.05",
            dict(
                nms_threshold=0.45,
                top_k=10,
                keep_top_k=6,
                threshold=0.05,
                code_type=ref.CENTER_SIZE,
            ),
            1,
        ),
        (
            "num_classes: 4 share_location: false background_label_id: -1 code_type: CORNER "
            "variance_encoded_in_target: true nms_param { nms_threshold: 0.3 } "
            "confidence_threshold: 0.2",
            dict(
                share_location=False,
                background=-1,
                code_type=ref.CORNER,
                var_in_target=True,
                threshold=0.2,
            ),
            C,
        ),
        (
            "num_classes: 4 background_label_id: 2 code_type: CORNER_SIZE nms_param { "
            "nms_threshold: 0.9 eta: 0.7 } keep_top_k: 30",
            dict(
                background=2, code_type=ref.CORNER_SIZE, nms_threshold=0.9, eta=0.7, keep_top_k=30
            ),
            1,
        ),
        (
            "num_classes: 4 code_type: CORNER_SIZE variance_encoded_in_target: true nms_param { "
            "nms_threshold: 0.2 top_k: 0 }",
            dict(code_type=ref.CORNER_SIZE, var_in_target=True, nms_threshold=0.2, top_k=0),
            1,
        ),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_forward_matches_reference(snippet, kw, loc_classes, seed):
    bottoms = _bottoms(loc_classes=loc_classes, seed=seed)(torch.Generator().manual_seed(3))
    top = _run(snippet, bottoms)
    want = ref_detection_output(*[b.numpy() for b in bottoms], num_classes=C, **kw)
    assert top.shape == want.shape
    np.testing.assert_allclose(top.numpy(), want, rtol=1e-12, atol=1e-12)


def test_prior_count_follows_a_reshape():
    """The fork's Reshape recounts the priors, so a net reshaped to another input size (more
    or fewer priors than at setup) decodes the priors it is given."""
    layer, _ = make_layer(
        "detection_output_param { num_classes: 4 nms_param { nms_threshold: 0.45 } }",
        SHAPES,
        type="DetectionOutput",
        phase="TEST",
        dtype=torch.float64,
    )
    loc, conf, prior = _bottoms()(torch.Generator().manual_seed(4))
    few = P // 2
    smaller = [
        loc[:, : few * 4],
        conf[:, : few * C],
        prior.reshape(2, P, 4)[:, :few].reshape(1, 2, few * 4),
    ]
    assert layer.output_shapes([tuple(b.shape) for b in smaller]) == [(1, 1, 1, 7)]
    want = ref_detection_output(*[b.numpy() for b in smaller], num_classes=C, nms_threshold=0.45)
    np.testing.assert_allclose(layer(*smaller).numpy(), want, rtol=1e-12, atol=1e-12)


def test_nms_suppresses_and_keep_top_k_cuts_across_labels():
    bottoms = _bottoms()(torch.Generator().manual_seed(5))
    loose = _run("num_classes: 4 nms_param { nms_threshold: 1 }", bottoms)
    tight = _run("num_classes: 4 nms_param { nms_threshold: 0.1 }", bottoms)
    assert loose.shape[2] == 2 * P * (C - 1) > tight.shape[2]
    top = _run("num_classes: 4 nms_param { nms_threshold: 0.1 } keep_top_k: 3", bottoms)
    assert top.shape[2] == 6  # 3 per image
    for i in range(2):
        mine = top[0, 0][top[0, 0, :, 0] == i]
        theirs = tight[0, 0][tight[0, 0, :, 0] == i]
        assert mine[:, 2].sort().values.tolist() == theirs[:, 2].sort().values[-3:].tolist()


@pytest.mark.parametrize(
    "snippet",
    [
        "num_classes: 4 confidence_threshold: 0.999",
        "num_classes: 4 keep_top_k: 0",
        "num_classes: 1 background_label_id: 0",
    ],
)
def test_no_detection_placeholder(snippet):
    bottoms = _bottoms()(torch.Generator().manual_seed(1))
    if "num_classes: 1" in snippet:
        bottoms[1] = bottoms[1].reshape(2, P, C)[..., :1].reshape(2, P)
    top = _run(f"{snippet} nms_param {{ nms_threshold: 0.5 }}", bottoms)
    want = [[0, -1, -1, -1, -1, -1, -1], [1, -1, -1, -1, -1, -1, -1]]
    assert top.tolist() == [[want]]


def test_optional_image_bottom_and_no_backward():
    bottoms = _bottoms()(torch.Generator().manual_seed(2))
    bottoms = [b.requires_grad_() for b in bottoms] + [torch.zeros(2, 3, 8, 8)]
    top = _run("num_classes: 4 nms_param { nms_threshold: 0.45 }", bottoms, n_bottoms=4)
    assert top.shape[0:2] == (1, 1) and top.shape[3] == 7 and not top.requires_grad
    layer, _ = make_layer(
        "detection_output_param { num_classes: 4 }", SHAPES, type="DetectionOutput"
    )
    assert not layer.has_backward and not any(layer.allow_force_backward(i) for i in range(3))
    assert layer.output_shapes(SHAPES) == [(1, 1, 1, 7)]


@pytest.mark.parametrize(
    "snippet,shapes,match",
    [
        ("nms_param { nms_threshold: 0.5 }", SHAPES, r"must specify num_classes"),
        (
            "num_classes: 4 nms_param { nms_threshold: -0.1 }",
            SHAPES,
            r"nms_threshold must be non negative",
        ),
        ("num_classes: 4 nms_param { eta: 0 }", SHAPES, r"nms_param.eta must be in \(0, 1\]"),
        ("num_classes: 4 nms_param { eta: 1.5 }", SHAPES, r"nms_param.eta must be in \(0, 1\]"),
        (
            "num_classes: 4",
            ((2, P * 4 - 4),) + SHAPES[1:],
            r"number of priors must match number of location predictions",
        ),
        (
            "num_classes: 4 share_location: false",
            SHAPES,
            r"number of priors must match number of location predictions.*24 priors \* 16",
        ),
        ("num_classes: 3", SHAPES, r"number of priors must match number of confidence"),
        (
            "num_classes: 4",
            ((3, P * 4),) + SHAPES[1:],
            r"loc and conf must have the same number of images",
        ),
        ("num_classes: 4", SHAPES[:2] + ((1, 3, P * 4),), r"bottom 2 must be PriorBox output"),
    ],
)
def test_error_bad_params_and_shapes(snippet, shapes, match):
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(DetectionOutput\): " + match):
        make_layer(f"detection_output_param {{ {snippet} }}", shapes, type="DetectionOutput")


def test_error_brocolli_thresholds_unsupported():
    with pytest.raises(UnsupportedError, match=r"\(DetectionOutput\): per-class thresholds"):
        make_layer(
            "detection_output_param { num_classes: 4 thresholds: 0.5 }",
            SHAPES,
            type="DetectionOutput",
        )


def test_error_degenerate_prior_for_center_size():
    bottoms = _bottoms()(torch.Generator().manual_seed(4))
    bottoms[2][0, 0, 4 * 5 + 2] = bottoms[2][0, 0, 4 * 5]  # prior 5: zero width
    with pytest.raises(DataError, match=r"\(DetectionOutput\).*positive width.*prior 5"):
        _run("num_classes: 4 code_type: CENTER_SIZE", bottoms)
    _run("num_classes: 4 code_type: CORNER", bottoms)  # CORNER never divides by the width


@pytest.mark.parametrize("eta", [1.0, 0.9])
def test_many_candidates_span_several_nms_blocks(eta):
    rng = np.random.default_rng(7)
    many = 300
    prior = ref.random_priors(rng, many)
    loc = rng.normal(0, 0.3, size=(1, many * 4))
    conf = ref.softmax(rng.normal(0, 1, size=(1, many, 2))).reshape(1, -1)
    bottoms = [torch.tensor(a) for a in (loc, conf, prior)]
    top = _run(
        f"num_classes: 2 code_type: CENTER_SIZE nms_param {{ nms_threshold: 0.6 eta: {eta} }}",
        bottoms,
    )
    want = ref_detection_output(
        loc, conf, prior, num_classes=2, code_type=ref.CENTER_SIZE, nms_threshold=0.6, eta=eta
    )
    assert 50 < want.shape[2] < many
    np.testing.assert_allclose(top.numpy(), want, rtol=1e-12, atol=1e-12)


def _f32_decode_center_size(prior, var, loc):
    """DecodeBBox CENTER_SIZE as the fork evaluates it: float fields and float products,
    C's double exp times the float prior width rounded once, centre -/+ half in double."""
    f32, f64 = np.float32, np.float64
    pw, ph = f32(prior[2] - prior[0]), f32(prior[3] - prior[1])
    pcx, pcy = f32((prior[0] + prior[2]) / f32(2)), f32((prior[1] + prior[3]) / f32(2))
    cx, cy = f32(var[0] * loc[0] * pw + pcx), f32(var[1] * loc[1] * ph + pcy)
    w = f32(np.exp(f64(f32(var[2] * loc[2]))) * f64(pw))
    h = f32(np.exp(f64(f32(var[3] * loc[3]))) * f64(ph))
    return [
        f32(f64(c) + s * f64(d) / 2)
        for s, c, d in ((-1, cx, w), (-1, cy, h), (1, cx, w), (1, cy, h))
    ]


def test_float32_center_size_decode_rounds_as_the_fork():
    """The fork's exp is C's double exp: float exp then a float multiply by the prior width
    was one bit off for about a quarter of the boxes."""
    rng = np.random.default_rng(5)
    p = 64
    prior = ref.random_priors(rng, p).astype(np.float32)
    loc = rng.normal(0, 1, size=(1, p * 4)).astype(np.float32)
    conf = np.tile(np.array([0.0, 1.0], np.float32), (1, p))  # every prior kept, NMS off
    layer, _ = make_layer(
        "detection_output_param { num_classes: 2 code_type: CENTER_SIZE "
        "nms_param { nms_threshold: 1.0 } }",
        [loc.shape, conf.shape, prior.shape],
        type="DetectionOutput",
        phase="TEST",
    )
    top = layer(*[torch.from_numpy(a) for a in (loc, conf, prior)]).numpy().reshape(-1, 7)
    boxes, variances = prior[0, 0].reshape(p, 4), prior[0, 1].reshape(p, 4)
    want = np.array(
        [_f32_decode_center_size(boxes[j], variances[j], loc.reshape(p, 4)[j]) for j in range(p)],
        np.float32,
    )
    np.testing.assert_array_equal(top[:, 3:], want)
