"""The SSD fork's training-side box bookkeeping (bbox_util.cpp), used by MultiBoxLoss.

GetGroundTruth, FindMatches, EncodeLocPrediction and MineHardExamples, batched over the
priors with torch. Matches are ``(N, K, P)`` long tensors, K the location keys (one, -1, with
share_location; else the non-background classes): a gt index within the image, -1 for
unmatched and -2 for a prior ignored as cross-boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import DataError
from ..proto import caffe_pb2
from . import _bbox
from ._functional.multibox import divide_forward_only

MB = caffe_pb2.MultiBoxLossParameter


@dataclass
class GroundTruth:
    """The kept ground truth of images 0..N-1, grouped by image in row order.

    ``boxes``/``labels`` end with one dummy row so that gathers stay valid without any gt.
    """

    boxes: torch.Tensor  # (G + 1, 4)
    labels: torch.Tensor  # (G + 1,) long
    start: torch.Tensor  # (N,) first row of each image
    count: list[int]  # per image

    def rows(self, i: int) -> slice:
        s = int(self.start[i])
        return slice(s, s + self.count[i])

    def label_of(self, match: torch.Tensor) -> torch.Tensor:
        """Label of each match (shape of ``match``, ``(N, ...)``); -1 where unmatched."""
        shape = (-1,) + (1,) * (match.dim() - 1)
        idx = self.start.reshape(shape) + match.clamp(min=0)
        return torch.where(match > -1, self.labels[idx.clamp(max=len(self.labels) - 1)], -1)

    def box_of(self, image: torch.Tensor, match: torch.Tensor) -> torch.Tensor:
        return self.boxes[self.start[image] + match]


def read_ground_truth(layer, label: torch.Tensor, num: int, use_difficult: bool) -> GroundTruth:
    """GetGroundTruth: rows [image, label, instance, xmin, ymin, xmax, ymax, difficult];
    image -1 rows skipped, a background label an error, difficult rows kept only when used."""
    rows = label.detach().reshape(-1, 8)
    per_image: dict[int, list[int]] = {}
    for r, v in enumerate(rows.tolist()):
        if int(v[0]) == -1:
            continue
        if int(v[1]) == layer.background:
            raise DataError(
                "found background label in the ground truth",
                layer=layer.name,
                layer_type=layer.caffe_type,
                expected=f"labels != background_label_id {layer.background}",
                got=f"row {r}: {v}",
            )
        if use_difficult or not v[7]:
            per_image.setdefault(int(v[0]), []).append(r)
    order = [r for i in range(num) for r in per_image.get(i, [])] + [0]
    kept = rows[torch.tensor(order, device=rows.device)] if len(rows) else rows.new_zeros(1, 8)
    count = [len(per_image.get(i, [])) for i in range(num)]
    start = torch.tensor([sum(count[:i]) for i in range(num)], device=rows.device)
    return GroundTruth(kept[:, 3:7], kept[:, 1].long(), start, count)


def find_matches(
    p,
    keys: list[int],
    truth: GroundTruth,
    loc: torch.Tensor,
    prior: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
):
    """FindMatches -> (match (N, K, P) long, overlaps (N, K, P)).

    With use_prior_for_matching the priors are matched once against all gt and a class key
    keeps the matches of its own label; otherwise each key's decoded ``loc`` (N, P, L, 4) is
    matched against the gt of its label (all gt for key -1).
    """
    pbox, pvar, psize = prior
    num, shape = loc.shape[0], (loc.shape[0], len(keys), pbox.shape[0])
    match = torch.full(shape, -1, dtype=torch.long, device=pbox.device)
    overlaps = torch.zeros(shape, dtype=pbox.dtype, device=pbox.device)
    args = (p.match_type == MB.PER_PREDICTION, p.overlap_threshold, p.ignore_cross_boundary_bbox)
    for i in range(num):
        if not truth.count[i]:
            continue  # no gt: every prior negative
        gt, labels = truth.boxes[truth.rows(i)], truth.labels[truth.rows(i)]
        gsize = _bbox.box_size(gt)
        if p.use_prior_for_matching:
            m, o = _bbox.match(gt, gsize, pbox, psize, *args)
            for k, key in enumerate(keys):
                own = (m > -1) & (labels[m.clamp(min=0)] == key)
                match[i, k] = m if key == -1 else torch.where(own, m, -1)
                overlaps[i, k] = o
            continue
        for k, key in enumerate(keys):
            sel = torch.arange(len(labels), device=pbox.device)
            if key != -1:
                sel = sel[labels == key]
            if not sel.numel():
                continue
            boxes = _bbox.decode(
                pbox,
                pvar,
                loc[i, :, max(key, 0)].detach(),
                p.code_type,
                p.encode_variance_in_target,
            )
            m, o = _bbox.match(gt[sel], gsize[sel], boxes, _bbox.box_size(boxes), *args)
            match[i, k] = torch.where(m > -1, sel[m.clamp(min=0)], m)
            overlaps[i, k] = o
    return match, overlaps


def encode_loc(
    p,
    keys: list[int],
    truth: GroundTruth,
    loc: torch.Tensor,
    prior: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    match: torch.Tensor,
):
    """EncodeLocPrediction -> (pred, target), (M, 4) rows for every match in image, key,
    prior order. ``pred`` carries the gradient to ``loc`` the way the fork copies it back."""
    pbox, pvar, _ = prior
    img, k, j = torch.nonzero(match > -1, as_tuple=True)
    target = _bbox.encode(
        pbox[j],
        pvar[j],
        truth.box_of(img, match[img, k, j]),
        p.code_type,
        p.encode_variance_in_target,
    )
    cols = torch.tensor([max(key, 0) for key in keys], device=loc.device)[k]
    pred = loc[img, j, cols]
    if p.bp_inside:  # out-of-image coordinates predict their target: zero gradient
        box = (
            pbox[j]
            if p.use_prior_for_matching
            else _bbox.decode(
                pbox[j], pvar[j], pred.detach(), p.code_type, p.encode_variance_in_target
            )
        )
        pred = torch.where((box < 0) | (box > 1), target, pred)
    if p.encode_variance_in_target:
        pred, target = divide_forward_only(pred, pvar[j]), target / pvar[j]
    return pred, target


def select_examples(
    p, loss: torch.Tensor, match: torch.Tensor, overlaps: torch.Tensor, has_gt: torch.Tensor
):
    """MineHardExamples' choice for one key: loss, match, overlaps (N, P) -> (match after
    mining, negatives (N, P) bool). Ties in the loss go to the lower prior index."""
    if p.mining_type == MB.HARD_EXAMPLE:
        eligible = torch.ones_like(match, dtype=torch.bool)
        num_sel = torch.full((match.shape[0],), p.sample_size, device=match.device)
    else:  # MAX_NEGATIVE: unmatched priors overlapping every gt less than neg_overlap
        eligible = (match == -1) & (overlaps < p.neg_overlap)
        num_pos = (match > -1).sum(1).to(torch.float32)
        num_sel = (num_pos * p.neg_pos_ratio).to(torch.long)  # float product, truncated
    num_sel = torch.minimum(num_sel, eligible.sum(1))
    order = torch.sort(
        torch.where(eligible, loss, float("-inf")), dim=1, descending=True, stable=True
    ).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    selected = eligible & (rank < num_sel.unsqueeze(1)) & has_gt.unsqueeze(1)
    if p.mining_type == MB.HARD_EXAMPLE:
        match = torch.where((match > -1) & ~selected, -1, match)
    return match, selected & (match == -1)
