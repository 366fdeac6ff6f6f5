"""Box maths of the SSD fork's bbox_util.cpp, batched over leading dimensions.

Boxes are ``(..., 4)`` tensors ``[xmin, ymin, xmax, ymax]`` in normalized coordinates. The
fork stores a box's size (``NormalizedBBox.size``) when it reads priors, ground truth, decoded
boxes and detections; ``box_size`` computes it once and the overlaps take it as an argument.
Operations keep the fork's float evaluation order, so float32 results (and hence threshold
decisions) match its CPU code. Only the normalized forms are here: the pixel-coordinate
variants (name_size_file) are not supported by the layers.
"""

from __future__ import annotations

import torch

from ..errors import LayerParamError
from ..proto import caffe_pb2

CodeType = caffe_pb2.PriorBoxParameter
CORNER, CENTER_SIZE, CORNER_SIZE = CodeType.CORNER, CodeType.CENTER_SIZE, CodeType.CORNER_SIZE


def label_id(value: int) -> int:
    """A uint32 background_label_id as the fork reads it into an int: 4294967295 is -1."""
    return value - (1 << 32) if value >= 1 << 31 else value


def box_size(b: torch.Tensor) -> torch.Tensor:
    """BBoxSize (normalized): w * h; 0 when xmax < xmin or ymax < ymin."""
    w, h = b[..., 2] - b[..., 0], b[..., 3] - b[..., 1]
    return torch.where((b[..., 2] < b[..., 0]) | (b[..., 3] < b[..., 1]), 0.0, w * h)


def jaccard(b1: torch.Tensor, s1: torch.Tensor, b2: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    """Pairwise JaccardOverlap of (..., M, 4) and (..., K, 4) boxes -> (..., M, K).

    ``s1``/``s2`` are the stored sizes; 0 unless the intersection has positive sides.
    """
    a, b = b1.unsqueeze(-2), b2.unsqueeze(-3)
    apart = (
        (b[..., 0] > a[..., 2])
        | (b[..., 2] < a[..., 0])
        | (b[..., 1] > a[..., 3])
        | (b[..., 3] < a[..., 1])
    )
    iw = torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])
    ih = torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])
    inter = iw * ih
    union = s1.unsqueeze(-1) + s2.unsqueeze(-2) - inter
    return torch.where(apart | ~(iw > 0) | ~(ih > 0), 0.0, inter / union)


def _exp_times(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``exp(a) * b`` stored in a float field: the fork calls C's double ``exp``, so the
    product is formed in double and rounded once (float exp then a float multiply differs
    in the last bit about a quarter of the time)."""
    return (torch.exp(a.double()) * b.double()).to(a.dtype)


def _log_over(ratio: torch.Tensor, var: torch.Tensor | None) -> torch.Tensor:
    """``log(ratio)`` (``/ var``) stored in a float field: C's double ``log``, divided in
    double, rounded once."""
    out = torch.log(ratio.double())
    return (out if var is None else out / var.double()).to(ratio.dtype)


def _center_form(b: torch.Tensor):
    """(width, height, center x, center y) of (..., 4) boxes."""
    w, h = b[..., 2] - b[..., 0], b[..., 3] - b[..., 1]
    return w, h, (b[..., 0] + b[..., 2]) / 2, (b[..., 1] + b[..., 3]) / 2


def encode(
    prior: torch.Tensor,
    var: torch.Tensor,
    gt: torch.Tensor,
    code_type: int,
    variance_in_target: bool,
) -> torch.Tensor:
    """EncodeBBox: the regression target of ``gt`` against ``prior`` (all (..., 4))."""
    if code_type == CORNER:
        out = gt - prior
        return out if variance_in_target else out / var
    pw, ph, pcx, pcy = _center_form(prior)
    if code_type == CENTER_SIZE:
        gw, gh, gcx, gcy = _center_form(gt)
        v = None if variance_in_target else var
        cx, cy = (gcx - pcx) / pw, (gcy - pcy) / ph
        if v is not None:
            cx, cy = cx / v[..., 0], cy / v[..., 1]
        log_w = _log_over(gw / pw, None if v is None else v[..., 2])
        log_h = _log_over(gh / ph, None if v is None else v[..., 3])
        return torch.stack([cx, cy, log_w, log_h], -1)
    if code_type == CORNER_SIZE:
        wh = torch.stack([pw, ph, pw, ph], -1)
        out = (gt - prior) / wh
        return out if variance_in_target else out / var
    raise LayerParamError(
        "unknown bbox code_type", expected="CORNER, CENTER_SIZE or CORNER_SIZE", got=code_type
    )


def decode(
    prior: torch.Tensor,
    var: torch.Tensor,
    loc: torch.Tensor,
    code_type: int,
    variance_in_target: bool,
) -> torch.Tensor:
    """DecodeBBox (no clip): the box ``loc`` encodes against ``prior`` (all (..., 4))."""
    if code_type == CORNER:
        return prior + loc if variance_in_target else prior + var * loc
    pw, ph, pcx, pcy = _center_form(prior)
    if code_type == CENTER_SIZE:
        if variance_in_target:
            cx, cy = loc[..., 0] * pw + pcx, loc[..., 1] * ph + pcy
            w, h = _exp_times(loc[..., 2], pw), _exp_times(loc[..., 3], ph)
        else:
            cx = var[..., 0] * loc[..., 0] * pw + pcx
            cy = var[..., 1] * loc[..., 1] * ph + pcy
            w = _exp_times(var[..., 2] * loc[..., 2], pw)
            h = _exp_times(var[..., 3] * loc[..., 3], ph)
        return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)
    if code_type == CORNER_SIZE:
        wh = torch.stack([pw, ph, pw, ph], -1)
        return prior + loc * wh if variance_in_target else prior + var * loc * wh
    raise LayerParamError(
        "unknown bbox code_type", expected="CORNER, CENTER_SIZE or CORNER_SIZE", got=code_type
    )


def sorted_candidates(scores: torch.Tensor, threshold: float, top_k: int):
    """GetMaxScoreIndex over the last dim: (order, valid), scores > threshold by stable
    descending sort, at most ``top_k`` (all when -1) per row."""
    masked = torch.where(scores > threshold, scores, float("-inf"))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices
    if -1 < top_k < scores.shape[-1]:
        order = order[..., :top_k]
    valid = torch.gather(scores, -1, order) > threshold
    return order, valid


def _keep_within_block(iou: torch.Tensor, valid: torch.Tensor, threshold: float) -> torch.Tensor:
    """Greedy NMS inside one block of score-sorted candidates: iou (G, B, B), valid (G, B).

    The kept set is the unique solution of keep_k = valid_k & no kept j < k overlaps k more
    than the threshold; iterating that equation from keep = valid fixes one more leading
    candidate per round, so it settles in at most B rounds (usually a few).
    """
    b = valid.shape[-1]
    earlier = torch.ones(b, b, dtype=torch.bool, device=iou.device).tril(-1)
    suppresses = ~(iou <= threshold) & earlier  # [k, j]: j (earlier) would remove k
    keep = valid.clone()
    for _ in range(b):
        new = valid & ~(suppresses & keep.unsqueeze(-2)).any(-1)
        if torch.equal(new, keep):
            break
        keep = new
    return keep


def _greedy_keep(
    cand: torch.Tensor, size: torch.Tensor, valid: torch.Tensor, threshold: float, block: int = 128
) -> torch.Tensor:
    """ApplyNMSFast's loop (fixed threshold) over score-sorted candidates (G, K, 4), in
    blocks of ``block``: a block first drops what the boxes kept before it overlap, then
    resolves itself. Memory and work scale with K * kept, as the fork's loop does."""
    keep = torch.zeros_like(valid)
    for s in range(0, valid.shape[-1], block):
        e = min(s + block, valid.shape[-1])
        rows, rsize, live = cand[:, s:e], size[:, s:e], valid[:, s:e]
        most = int(keep[:, :s].sum(-1).max()) if s else 0
        if most:  # the kept boxes so far, first in each row (stable), padded by others
            kept = torch.sort((~keep[:, :s]).to(torch.uint8), dim=-1, stable=True).indices
            kept = kept[:, :most]
            earlier = jaccard(
                rows,
                rsize,
                cand.gather(1, kept.unsqueeze(-1).expand(-1, -1, 4)),
                size.gather(1, kept),
            )  # (G, b, most)
            hit = ~(earlier <= threshold) & keep[:, :s].gather(1, kept).unsqueeze(-2)
            live = live & ~hit.any(-1)
        keep[:, s:e] = _keep_within_block(jaccard(rows, rsize, rows, rsize), live, threshold)
    return keep


def _greedy_keep_adaptive(
    cand: torch.Tensor, size: torch.Tensor, valid: torch.Tensor, threshold: float, eta: float
) -> torch.Tensor:
    """ApplyNMSFast's loop with eta < 1: after each kept box a float threshold above 0.5 is
    multiplied by eta, so candidates are decided one at a time."""
    g, k = valid.shape
    thr = torch.full((g, 1), threshold, dtype=torch.float32, device=valid.device)
    keep = torch.zeros_like(valid)
    for i in range(k):
        iou = jaccard(cand[:, i : i + 1], size[:, i : i + 1], cand[:, :i], size[:, :i])[:, 0]
        kept = valid[:, i] & ~(keep[:, :i] & ~(iou <= thr.to(iou.dtype))).any(-1)
        keep[:, i] = kept
        thr = torch.where(kept.unsqueeze(-1) & (thr > 0.5), thr * eta, thr)
    return keep


def nms_fast(
    boxes: torch.Tensor,
    sizes: torch.Tensor,
    scores: torch.Tensor,
    score_threshold: float,
    nms_threshold: float,
    eta: float,
    top_k: int,
):
    """ApplyNMSFast for G groups: boxes (G, P, 4), sizes/scores (G, P).

    Returns (order (G, K) prior indices by descending score, keep (G, K) mask), K at most
    top_k and the largest candidate count of a group.
    """
    order, valid = sorted_candidates(scores, score_threshold, top_k)
    most = int(valid.sum(-1).max()) if valid.numel() else 0  # valid ones sort first
    order, valid = order[..., :most], valid[..., :most]
    cand = torch.gather(boxes, 1, order.unsqueeze(-1).expand(*order.shape, 4))
    size = torch.gather(sizes, 1, order)
    if eta < 1.0:
        return order, _greedy_keep_adaptive(cand, size, valid, nms_threshold, eta)
    return order, _greedy_keep(cand, size, valid, nms_threshold)


def match(
    gt: torch.Tensor,
    gt_size: torch.Tensor,
    pred: torch.Tensor,
    pred_size: torch.Tensor,
    per_prediction: bool,
    overlap_threshold: float,
    ignore_cross_boundary: bool,
):
    """MatchBBox of P predictions against G ground truth boxes (G >= 1).

    Returns (match_indices (P,) long: gt index, -1 unmatched, -2 ignored cross-boundary;
    match_overlaps (P,)). Bipartite rounds take the largest remaining overlap, ties to the
    lowest prediction then gt index; PER_PREDICTION then matches the rest at >= threshold.
    """
    p, g = pred.shape[0], gt.shape[0]
    iou = jaccard(pred, pred_size, gt, gt_size)
    stored = iou > 1e-6  # the fork keeps only these overlaps
    indices = torch.full((p,), -1, dtype=torch.long, device=pred.device)
    if ignore_cross_boundary:
        cross = ((pred < 0) | (pred > 1)).any(-1)
        indices = torch.where(cross, -2, indices)
        stored = stored & ~cross.unsqueeze(-1)
    overlaps = torch.where(stored, iou, 0.0).amax(-1) if g else iou.new_zeros(p)
    neg = torch.tensor(-1.0, dtype=iou.dtype, device=iou.device)
    pool = torch.ones(g, dtype=torch.bool, device=pred.device)
    rows = torch.arange(p, device=pred.device)
    for _ in range(g):
        ok = stored & (indices == -1).unsqueeze(-1) & pool
        cand = torch.where(ok, iou, neg).reshape(-1)
        best = torch.argmax(cand)  # first maximum: lowest prediction, then lowest gt
        found = cand[best] > -1
        i, j = best // g, best % g
        indices = torch.where(found & (rows == i), j, indices)
        overlaps = torch.where(found & (rows == i), cand[best], overlaps)
        pool = pool & ~(found & (torch.arange(g, device=pred.device) == j))
    if per_prediction:
        ok = stored & (iou >= overlap_threshold) & (indices == -1).unsqueeze(-1)
        cand = torch.where(ok, iou, neg)
        best_val, best = cand.max(-1) if g else (cand.new_full((p,), -1.0), indices)
        found = best_val > -1
        indices = torch.where(found, best, indices)
        overlaps = torch.where(found, best_val, overlaps)
    return indices, overlaps
