"""DetectionEvaluate (SSD fork): true/false positive records of detections, for mAP."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import DataError, UnsupportedError
from ..registry import register_layer
from . import _bbox
from .base import CaffeLayer, Exactly, Shape


@register_layer("DetectionEvaluate", fork="SSD")
class DetectionEvaluateLayer(CaffeLayer):
    """Per-class ground-truth counts and per-detection TP/FP flags.
    Caffe type ``DetectionEvaluate`` (SSD fork), ``detection_evaluate_param``.

    Bottoms: detections (1, 1, D, 7) as DetectionOutput gives, ground truth (1, 1, G, 8).
    Top (1, 1, num_pos_classes + valid detections, 5): first per non-background class
    [-1, class, num_gt, -1, -1] (difficult gt counted only with evaluate_difficult_gt), then per
    image and label (ascending) each detection [image, label, score, tp, fp]; where the label
    has ground truth in the image, detections in descending score order, tp when the best
    overlapping gt (IoU >= overlap_threshold) is not yet taken, both 0 when it is difficult
    and difficult gt is not evaluated. Ground truth stops at the first row with image -1;
    detection rows with label -1 are skipped (and not counted). No backward, as in the fork.
    Differs from torch: no torch equivalent; detections of equal score keep their input order
    (the fork's std::sort leaves them unspecified past 16).
    """

    param_field = "detection_evaluate_param"
    shape_depends_on_data = True
    bottoms = Exactly(2)
    has_backward = False
    restrictions = (
        "name_size_file (scoring in original-image pixels, with resize_param) is "
        "unsupported: boxes are evaluated normalized, as the fork does without it"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if not p.HasField("num_classes"):
            raise self.error("must provide num_classes", expected="num_classes >= 1", got=None)
        if not p.overlap_threshold > 0:
            raise self.error(
                "overlap_threshold must be positive", expected="> 0", got=p.overlap_threshold
            )
        if p.HasField("name_size_file"):
            raise self.error(
                "name_size_file is not supported",
                got=p.name_size_file,
                hint="drop name_size_file to evaluate normalized boxes",
                cls=UnsupportedError,
            )
        self.num_classes, self.background = p.num_classes, _bbox.label_id(p.background_label_id)
        if self.background != -1 and not 0 <= self.background < self.num_classes:
            # the fork sizes the top for num_classes - 1 classes and then writes num_classes
            raise self.error(
                "background_label_id must be -1 (none) or a class id",
                expected=f"-1 or 0..{self.num_classes - 1}",
                got=p.background_label_id,
            )
        self._check_shapes(self.bottom_shapes)

    def _check_shapes(self, shapes: Sequence[Shape]) -> None:
        for i, width in ((0, 7), (1, 8)):
            s = tuple(shapes[i])
            if len(s) != 4 or s[0] != 1 or s[1] != 1 or s[3] != width:
                raise self.error(
                    f"bottom {i} must be (1, 1, rows, {width})",
                    expected=f"(1, 1, rows, {width})",
                    got=s,
                )

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        self._check_shapes(bottom_shapes)
        # The fork counts the detection rows with label != -1; without data, assume all are.
        return [(1, 1, self._num_pos_classes() + int(bottom_shapes[0][2]), 5)]

    def _num_pos_classes(self) -> int:
        return self.num_classes if self.background == -1 else self.num_classes - 1

    def _group(
        self, rows: list[list[float]], what: str, stop_at_end: bool
    ) -> dict[int, dict[int, list[int]]]:
        """Row indices by image then label; rows of image -1 end the ground truth (break)
        or are skipped (detections); a background label is an error, as in the fork."""
        groups: dict[int, dict[int, list[int]]] = {}
        for r, v in enumerate(rows):
            image, label = int(v[0]), int(v[1])
            if image == -1:
                if stop_at_end:
                    break
                continue
            if label == self.background:
                raise DataError(
                    f"found background label in the {what}",
                    layer=self.name,
                    layer_type=self.caffe_type,
                    expected=f"labels != background_label_id {self.background}",
                    got=f"row {r}: {v}",
                )
            groups.setdefault(image, {}).setdefault(label, []).append(r)
        return groups

    def _num_pos(self, gt_groups, gts) -> dict[int, int]:
        """Ground-truth count per label over all images (difficult only when evaluated)."""
        counted: dict[int, int] = {}
        for labels in gt_groups.values():
            for label, rs in labels.items():
                n = sum(1 for r in rs if self.param.evaluate_difficult_gt or not gts[r][7])
                counted[label] = counted.get(label, 0) + n
        return counted

    def _tp_fp(self, key: tuple[int, int], dets, gts, iou, det_rows, gt_rows) -> list[list[float]]:
        """[image, label, score, tp, fp] of one image and label, by descending score."""
        out = []
        visited = [False] * len(gt_rows)
        for r in sorted(det_rows, key=lambda r: -dets[r][2]):
            best, jmax = -1.0, -1
            for j, gr in enumerate(gt_rows):
                if iou[r][gr] > best:
                    best, jmax = iou[r][gr], j
            flags = [0.0, 1.0]  # false positive
            if best >= self.param.overlap_threshold:
                if self.param.evaluate_difficult_gt or not gts[gt_rows[jmax]][7]:
                    flags = [0.0, 1.0] if visited[jmax] else [1.0, 0.0]
                    visited[jmax] = True
                else:
                    flags = [0.0, 0.0]  # matched a difficult box: neither
            out.append([*key, dets[r][2], *flags])
        return out

    def forward(self, det: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        d, g = det.detach().reshape(-1, 7), gt.detach().reshape(-1, 8)
        # Overlaps in the input's precision on its device; the bookkeeping is sequential.
        iou = _bbox.jaccard(
            d[:, 3:7], _bbox.box_size(d[:, 3:7]), g[:, 3:7], _bbox.box_size(g[:, 3:7])
        ).tolist()
        dets, gts = d.tolist(), g.tolist()
        gt_groups = self._group(gts, "ground truth", stop_at_end=True)
        det_groups = self._group(dets, "detections", stop_at_end=False)
        num_pos = self._num_pos(gt_groups, gts)
        out = [
            [-1.0, float(c), float(num_pos.get(c, 0)), -1.0, -1.0]
            for c in range(self.num_classes)
            if c != self.background
        ]
        for image in sorted(det_groups):
            for label in sorted(det_groups[image]):
                if label == -1:
                    continue
                rs = det_groups[image][label]
                gt_rows = gt_groups.get(image, {}).get(label)
                if gt_rows is None:  # no ground truth of this label: all false positives
                    out += [[image, label, dets[r][2], 0.0, 1.0] for r in rs]
                else:
                    out += self._tp_fp((image, label), dets, gts, iou, rs, gt_rows)
        rows = sum(1 for v in dets if v[1] != -1) + self._num_pos_classes()
        out += [[0.0] * 5] * (rows - len(out))
        return torch.tensor(out, dtype=det.dtype, device=det.device).reshape(1, 1, rows, 5)
