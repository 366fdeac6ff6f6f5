"""numpy statements of the SSD fork's box maths (bbox_util.cpp), one box at a time.

Shared by the PriorBox / DetectionOutput / MultiBoxLoss / DetectionEvaluate tests. Written
from the fork's loops in float64; they never call torchcaffe.
"""

from __future__ import annotations

import numpy as np

CORNER, CENTER_SIZE, CORNER_SIZE = 1, 2, 3


def box_size(b) -> float:
    """BBoxSize: w * h, 0 for an inverted box."""
    if b[2] < b[0] or b[3] < b[1]:
        return 0.0
    return (b[2] - b[0]) * (b[3] - b[1])


def jaccard(a, b) -> float:
    """JaccardOverlap: intersection over union, 0 when the boxes do not intersect."""
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return 0.0
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if not (iw > 0 and ih > 0):
        return 0.0
    inter = iw * ih
    return inter / (box_size(a) + box_size(b) - inter)


def _center(b):
    w, h = b[2] - b[0], b[3] - b[1]
    return w, h, (b[0] + b[2]) / 2, (b[1] + b[3]) / 2


def decode(prior, var, loc, code_type, var_in_target):
    """DecodeBBox without clipping."""
    v = np.ones(4) if var_in_target else np.asarray(var)
    if code_type == CORNER:
        return np.asarray(prior) + v * loc
    pw, ph, pcx, pcy = _center(prior)
    if code_type == CORNER_SIZE:
        return np.asarray(prior) + v * loc * np.array([pw, ph, pw, ph])
    cx, cy = v[0] * loc[0] * pw + pcx, v[1] * loc[1] * ph + pcy
    w, h = np.exp(v[2] * loc[2]) * pw, np.exp(v[3] * loc[3]) * ph
    return np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])


def encode(prior, var, gt, code_type, var_in_target):
    """EncodeBBox: the regression target of ``gt`` against ``prior``."""
    v = np.ones(4) if var_in_target else np.asarray(var)
    if code_type == CORNER:
        return (np.asarray(gt) - prior) / v
    pw, ph, pcx, pcy = _center(prior)
    if code_type == CORNER_SIZE:
        return (np.asarray(gt) - prior) / np.array([pw, ph, pw, ph]) / v
    gw, gh, gcx, gcy = _center(gt)
    return np.array([(gcx - pcx) / pw, (gcy - pcy) / ph, np.log(gw / pw), np.log(gh / ph)]) / v


def random_priors(rng, num: int) -> np.ndarray:
    """(1, 2, num * 4) PriorBox-like blob: boxes of positive size, variances 0.1/0.2."""
    c = rng.uniform(0.1, 0.9, size=(num, 2))
    wh = rng.uniform(0.1, 0.5, size=(num, 2))
    boxes = np.concatenate([c - wh / 2, c + wh / 2], 1)
    var = np.tile([0.1, 0.1, 0.2, 0.2], (num, 1))
    return np.stack([boxes.reshape(-1), var.reshape(-1)])[None]


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)
