"""Proposal: Faster R-CNN region proposals from RPN scores and box deltas.

Reference: brocolli-caffe 9.0.2, src/caffe/layers/proposal_layer.cpp + src/caffe/util/nms.cpp.
The pipeline (anchors -> deltas -> clip -> size test -> sort -> NMS) also serves py-faster-rcnn's
Python ``rpn.proposal_layer.ProposalLayer`` (``_python_substitutes.py``), which overrides the
anchors, the size test and sort, and the NMS overlap test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import torch

from ..proto import caffe_pb2
from ..registry import register_layer
from ._narrow import computed_in_float32
from .base import Arity, Between, CaffeLayer, Exactly, Shape


def brocolli_anchors(p: caffe_pb2.ProposalParameter) -> np.ndarray:
    """The fork's anchors (float32 math): half-size 0.5 * (int)(sqrt(b^2 / r) * s / b - 0.5)."""
    f = np.float32
    base = int(p.base_size)
    area, center = f(base * base), f(0.5) * (f(base) - f(1))
    out = []
    for ratio in p.ratio:
        ratio_w = f(np.sqrt(area / f(ratio)))
        ratio_h = f(ratio_w * f(ratio))
        for scale in p.scale:
            half_w = f(0.5) * int(float(f(ratio_w * f(scale))) / base - 1.0 + 0.5)
            half_h = f(0.5) * int(float(f(ratio_h * f(scale))) / base - 1.0 + 0.5)
            out.append([center - half_w, center - half_h, center + half_w, center + half_h])
    return np.array(out, dtype=np.float32).reshape(-1, 4)


def fork_sort_order(scores: np.ndarray, num_top: int) -> np.ndarray:
    """The permutation the fork's sort_box leaves: a descending quicksort (first element as
    pivot, two-pointer partition) that only sorts what lands before ``num_top``; not stable.

    Each partition is vectorized: the scans stop at the elements below the pivot (from the
    left) and above it (from the right), swapped pairwise while the left one comes first.
    """
    key = np.array(scores, copy=True)
    perm = np.arange(key.shape[0])
    stack = [(0, key.shape[0] - 1)] if key.shape[0] > 1 else []
    while stack:
        start, end = stack.pop()
        pivot, seg = key[start], key[start + 1 : end + 1]
        low = np.flatnonzero(seg < pivot) + start + 1  # where the left scan stops
        high = np.flatnonzero(seg > pivot)[::-1] + start + 1  # where the right scan stops
        k = min(low.shape[0], high.shape[0])
        m = int(np.count_nonzero(low[:k] < high[:k]))  # the swaps before the scans cross
        a, b = low[:m], high[:m]
        key[a], key[b] = key[b], key[a]
        perm[a], perm[b] = perm[b], perm[a]
        right = max(high[m] if m < high.shape[0] else start, low[m - 1] if m else start)
        if right > start:
            key[[start, right]] = key[[right, start]]
            perm[[start, right]] = perm[[right, start]]
        if start < right - 1:
            stack.append((start, right - 1))
        if right + 1 < num_top and right + 1 < end:
            stack.append((right + 1, end))
    return perm


def greedy_nms(
    boxes: torch.Tensor, thresh: float, max_out: int, disjoint_zero: bool
) -> torch.Tensor:
    """Indices kept by greedy NMS over score-sorted ``boxes`` (P x 4), in keep order.

    IoU counts pixels inclusively (+1); a box is suppressed when IoU > thresh (in the boxes'
    dtype). ``disjoint_zero``: the fork's early exit (IoU 0 when one box lies strictly beyond
    the other, even if the +1 widths would overlap).
    """
    count = min(int(boxes.shape[0]), max_out)
    keep = torch.full((count,), -1, dtype=torch.long, device=boxes.device)
    if count == 0:
        return keep
    x1, y1, x2, y2 = boxes.unbind(1)
    area = (x2 - x1 + 1) * (y2 - y1 + 1)
    thresh_t = torch.tensor(thresh, dtype=boxes.dtype, device=boxes.device)
    zero = torch.zeros((), dtype=boxes.dtype, device=boxes.device)
    alive = torch.ones(boxes.shape[0], dtype=torch.bool, device=boxes.device)
    check_every = 1 if boxes.device.type == "cpu" else 64  # each check syncs with the device
    for t in range(count):
        i = torch.argmax(alive.to(torch.uint8)).view(1)  # first alive box (argmax: the first)
        ok = alive.index_select(0, i)
        keep[t : t + 1] = torch.where(ok, i, -1)
        b = boxes.index_select(0, i)[0]
        w = torch.maximum(zero, torch.minimum(b[2], x2) - torch.maximum(b[0], x1) + 1)
        h = torch.maximum(zero, torch.minimum(b[3], y2) - torch.maximum(b[1], y1) + 1)
        inter = w * h
        iou = inter / (area.index_select(0, i) + area - inter)
        if disjoint_zero:
            apart = (b[0] > x2) | (b[1] > y2) | (b[2] < x1) | (b[3] < y1)
            iou = torch.where(apart, zero, iou)
        alive = (alive & ~(iou > thresh_t) & ok).index_fill_(0, i, False)
        if (t + 1) % check_every == 0 and not bool(alive.any()):
            break
    return keep[keep >= 0]


@register_layer("Proposal", fork="brocolli (Faster R-CNN)")
class ProposalLayer(CaffeLayer):
    """RPN proposals. Caffe type ``Proposal`` (brocolli fork), ``proposal_param`` (feat_stride =
    16, base_size = 16, min_size = 16, ratio, scale (at least one each), pre_nms_topn = 6000,
    post_nms_topn = 300, nms_thresh = 0.7).

    Bottoms: scores N x 2A x H x W (foreground: the second A channels), deltas N x 4A x H x W,
    im_info (rows [height width ...]; every image uses row 0). Anchors are the fork's (scale is
    roughly the anchor side in pixels, not py-faster-rcnn's multiple of base_size). Boxes
    under min_size (not scaled by im_info) keep a score of 0; the top pre_nms_topn by score,
    tied scores in the order the fork's unstable partial quicksort leaves them, go through
    NMS (IoU > nms_thresh suppresses; 0 for boxes strictly apart), up to post_nms_topn
    survive. Tops: rois K x 5 ``[n x1 y1 x2 y2]``,
    optional scores K. K depends on the data; output_shapes gives Caffe's N * post_nms_topn.
    No backward (Caffe's is empty).
    Differs from torch: data-dependent output size; NMS runs a short loop on the device.
    """

    bottoms: ClassVar[Arity] = Exactly(3)
    tops: ClassVar[Arity] = Between(1, 2)
    shape_depends_on_data = True
    param_field = "proposal_param"
    has_backward = False
    restrictions = "scores with NaN: the fork's quicksort order is not reproduced"
    min_im_info = 2
    anchors: torch.Tensor  # A x 4 buffer (not saved: rebuilt from the params)

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self._setup(self.param)

    def _setup(self, p: caffe_pb2.ProposalParameter) -> None:
        if not p.ratio or not p.scale:
            raise self.error(
                "anchors need at least one ratio and one scale",
                expected="proposal_param { ratio: ... scale: ... }",
                got=f"{len(p.ratio)} ratio(s), {len(p.scale)} scale(s)",
            )
        for field in ("ratio", "scale"):
            bad = [v for v in getattr(p, field) if not v > 0]
            if bad:
                raise self.error(f"every {field} must be > 0", expected=f"{field} > 0", got=bad[0])
        for field in ("feat_stride", "base_size", "post_nms_topn"):
            if getattr(p, field) <= 0:
                raise self.error(
                    f"{field} must be > 0", expected=f"{field} > 0", got=getattr(p, field)
                )
        anchors = self.make_anchors()
        self.num_anchors = anchors.shape[0]
        self.register_buffer("anchors", torch.from_numpy(anchors).float(), persistent=False)
        self.check_bottoms(self.bottom_shapes)

    def make_anchors(self) -> np.ndarray:
        """A x 4 anchors ``[x1 y1 x2 y2]`` around the first cell, ratio-major."""
        return brocolli_anchors(self.param)

    def check_bottoms(self, bottom_shapes: Sequence[Shape]) -> None:
        scores, deltas, im_info = bottom_shapes
        a = self.num_anchors
        if len(scores) != 4 or scores[1] != 2 * a:
            raise self.error(
                "bottom[0] must hold background and foreground scores per anchor",
                expected=f"N x {2 * a} x H x W ({a} anchors)",
                got=scores,
            )
        if tuple(deltas) != (scores[0], 4 * a, scores[2], scores[3]):
            raise self.error(
                "bottom[1] must hold 4 box deltas per anchor",
                expected=f"{(scores[0], 4 * a, scores[2], scores[3])}",
                got=deltas,
            )
        per_row = int(np.prod(im_info[1:])) if len(im_info) > 1 else 0
        if len(im_info) < 1 or im_info[0] < 1 or per_row < self.min_im_info:
            raise self.error(
                "bottom[2] must be im_info rows [height width scale]",
                expected=f"1 x {max(self.min_im_info, 3)}",
                got=im_info,
            )

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        self.check_bottoms(bottom_shapes)
        rows = bottom_shapes[0][0] * int(self.param.post_nms_topn)
        return [(rows, 5), (rows,)][: self.num_tops]

    # -- the pipeline ------------------------------------------------------------------------
    def proposals(
        self, scores: torch.Tensor, deltas: torch.Tensor, im_info: torch.Tensor, n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Image n's boxes (P x 4) and scores (P), ordered by (h, w, anchor), clipped."""
        a, (h, w) = self.num_anchors, scores.shape[-2:]
        dtype, device = scores.dtype, scores.device
        stride = int(self.param.feat_stride)
        sy = torch.arange(h, device=device).to(dtype) * stride
        sx = torch.arange(w, device=device).to(dtype) * stride
        shift = torch.stack(
            torch.broadcast_tensors(sx[None, :], sy[:, None], sx[None, :], sy[:, None]), -1
        )
        anchors = (shift[:, :, None, :] + self.anchors.to(dtype)).reshape(-1, 4)
        d = deltas[n].reshape(a, 4, h, w).permute(2, 3, 0, 1).reshape(-1, 4)
        fg = scores[n, a:].permute(1, 2, 0).reshape(-1)
        widths = anchors[:, 2] - anchors[:, 0] + 1
        heights = anchors[:, 3] - anchors[:, 1] + 1
        ctr_x = anchors[:, 0] + 0.5 * widths
        ctr_y = anchors[:, 1] + 0.5 * heights
        pred_x = d[:, 0] * widths + ctr_x
        pred_y = d[:, 1] * heights + ctr_y
        pred_w = torch.exp(d[:, 2]) * widths
        pred_h = torch.exp(d[:, 3]) * heights
        boxes = torch.stack(
            [
                pred_x - 0.5 * pred_w,
                pred_y - 0.5 * pred_h,
                pred_x + 0.5 * pred_w,
                pred_y + 0.5 * pred_h,
            ],
            1,
        )
        limit = torch.stack([im_info[1], im_info[0], im_info[1], im_info[0]]) - 1
        boxes = torch.maximum(
            torch.minimum(boxes, limit), torch.zeros((), dtype=dtype, device=device)
        )
        return boxes, fg

    def select(
        self, boxes: torch.Tensor, fg: torch.Tensor, im_info: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The fork: boxes under min_size score 0; sort_box's order; first pre_nms_topn.

        A descending sort gives sort_box's order unless tied scores reach the first
        pre_nms_topn (or its boundary); only then the quicksort is replayed on the host.
        """
        min_size = torch.tensor(float(self.param.min_size), dtype=boxes.dtype, device=boxes.device)
        big = (boxes[:, 2] - boxes[:, 0] + 1 >= min_size) & (
            boxes[:, 3] - boxes[:, 1] + 1 >= min_size
        )
        fg = fg * big.to(fg.dtype)
        top = int(self.param.pre_nms_topn)
        ranked, order = torch.sort(fg, descending=True)
        head = ranked[: top + 1]
        if top > 0 and bool((head[1:] == head[:-1]).any()):
            order = torch.from_numpy(fork_sort_order(fg.cpu().numpy(), top)).to(fg.device)
        order = order[:top]
        return boxes[order], fg[order]

    nms_disjoint_zero = True

    # pixel coordinates near 1000 are 8 apart in bfloat16 (0.5 in float16), which moves boxes
    # and NMS overlaps, and the tie replay has no bfloat16 numpy: decode and select in float32
    @computed_in_float32
    def forward(self, scores: torch.Tensor, deltas: torch.Tensor, im_info: torch.Tensor):
        rois, kept_scores = [], []
        with torch.no_grad():
            info = im_info.reshape(im_info.shape[0], -1)[0].to(scores.dtype)
            for n in range(scores.shape[0]):
                boxes, fg = self.proposals(scores, deltas.to(scores.dtype), info, n)
                boxes, fg = self.select(boxes, fg, info)
                keep = greedy_nms(
                    boxes,
                    float(self.param.nms_thresh),
                    int(self.param.post_nms_topn),
                    self.nms_disjoint_zero,
                )
                batch = torch.full(
                    (keep.shape[0], 1), float(n), dtype=scores.dtype, device=scores.device
                )
                rois.append(torch.cat([batch, boxes[keep]], 1))
                kept_scores.append(fg[keep])
            tops = (torch.cat(rois), self.score_top(torch.cat(kept_scores)))
        return tops[0] if self.num_tops == 1 else tops

    def score_top(self, scores: torch.Tensor) -> torch.Tensor:
        return scores
