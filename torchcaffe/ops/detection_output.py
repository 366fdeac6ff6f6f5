"""DetectionOutput (SSD fork): decode box predictions, per-class NMS, keep the best."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..errors import DataError, UnsupportedError
from ..registry import register_layer
from . import _bbox
from .base import Between, CaffeLayer, Shape


def check_prior_counts(
    layer: CaffeLayer, shapes: Sequence[Shape], loc_classes: int, num_classes: int
) -> int:
    """The fork's Reshape checks: prior count from bottom 2, matching loc and conf -> priors."""
    loc, conf, prior = (tuple(s) for s in shapes[:3])
    if len(prior) < 3 or prior[1] != 2 or prior[2] % 4:
        raise layer.error("bottom 2 must be PriorBox output (1, 2, num_priors * 4)", got=prior)
    num_priors = prior[2] // 4
    if loc[0] != conf[0]:
        raise layer.error(
            "loc and conf must have the same number of images", expected=loc[0], got=conf[0]
        )
    for what, shape, per in (("location", loc, loc_classes * 4), ("confidence", conf, num_classes)):
        if math.prod(shape[1:]) != num_priors * per:
            raise layer.error(
                f"number of priors must match number of {what} predictions",
                expected=f"{num_priors} priors * {per} = {num_priors * per} values per image",
                got=shape,
            )
    return num_priors


def split_priors(prior: torch.Tensor, num_priors: int):
    """GetPriorBBoxes: (boxes (P, 4), variances (P, 4), stored sizes (P,))."""
    flat = prior.detach().reshape(-1)[: 2 * num_priors * 4].reshape(2, num_priors, 4)
    return flat[0], flat[1], _bbox.box_size(flat[0])


def check_prior_boxes(layer: CaffeLayer, boxes: torch.Tensor, code_type: int) -> None:
    """DecodeBBox's check: CENTER_SIZE and CORNER_SIZE need priors of positive width and
    height (the fork aborts on the first that is not)."""
    if code_type == _bbox.CORNER or boxes.is_meta:
        return
    bad = ~((boxes[:, 2] - boxes[:, 0] > 0) & (boxes[:, 3] - boxes[:, 1] > 0))
    if bool(bad.any()):
        k = int(torch.nonzero(bad)[0, 0])
        raise DataError(
            "prior boxes must have positive width and height to decode against",
            layer=layer.name,
            layer_type=layer.caffe_type,
            expected="xmax > xmin and ymax > ymin",
            got=f"prior {k}: {boxes[k].tolist()}",
        )


@register_layer("DetectionOutput", fork="SSD")
class DetectionOutputLayer(CaffeLayer):
    """SSD detections: decode loc against the priors, per-class ApplyNMSFast, keep_top_k.
    Caffe type ``DetectionOutput`` (SSD fork), ``detection_output_param``.

    Bottoms: loc (N, P*L*4), conf (N, P*C) (scores, e.g. after softmax), priors (1, 2, P*4),
    optionally the image (visualize only). Top (1, 1, D, 7) rows [image, label, score, xmin,
    ymin, xmax, ymax], D known only after the forward; per image by label ascending, within a
    label in NMS order. No detection at all: N rows [i, -1, -1, -1, -1, -1, -1].
    Candidates are scores > confidence_threshold, stable-sorted descending, at most top_k.
    CENTER_SIZE / CORNER_SIZE need priors of positive size (DataError where the fork aborts).
    No backward, as in the fork.
    Differs from torch: no torch equivalent; ties at the keep_top_k cut keep label then NMS
    order (the fork's std::sort leaves them unspecified past 16 candidates).
    """

    param_field = "detection_output_param"
    shape_depends_on_data = True
    bottoms = Between(3, 4)
    has_backward = False
    restrictions = (
        "save_output_param (writing result files) and visualize / "
        "visualize_threshold / save_file (OpenCV display) are accepted and ignored: "
        "the layer writes no files and shows nothing; brocolli's per-class "
        "thresholds are unsupported"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if not p.HasField("num_classes"):
            raise self.error("must specify num_classes", expected="num_classes >= 1", got=None)
        if p.thresholds:
            raise self.error(
                "per-class thresholds (brocolli) are not supported",
                got=list(p.thresholds),
                hint="use confidence_threshold",
                cls=UnsupportedError,
            )
        self.num_classes = p.num_classes
        self.share_location = p.share_location
        self.loc_classes = 1 if p.share_location else p.num_classes
        self.background = p.background_label_id
        self.confidence_threshold = (
            p.confidence_threshold
            if p.HasField("confidence_threshold")
            else -torch.finfo(torch.float32).max
        )
        nms = p.nms_param
        if nms.nms_threshold < 0:
            raise self.error("nms_threshold must be non negative", got=nms.nms_threshold)
        if not 0 < nms.eta <= 1:
            raise self.error("nms_param.eta must be in (0, 1]", got=nms.eta)
        self.nms_threshold, self.eta = nms.nms_threshold, nms.eta
        self.top_k = nms.top_k if nms.HasField("top_k") else -1
        self.keep_top_k = p.keep_top_k
        self.code_type = p.code_type
        check_prior_counts(self, self.bottom_shapes, self.loc_classes, self.num_classes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        check_prior_counts(self, bottom_shapes, self.loc_classes, self.num_classes)
        return [(1, 1, 1, 7)]  # the fork's placeholder; the real count comes from the data

    def forward(
        self,
        loc: torch.Tensor,
        conf: torch.Tensor,
        prior: torch.Tensor,
        image: torch.Tensor | None = None,
    ) -> torch.Tensor:
        num = loc.shape[0]
        # the fork's Reshape recounts the priors (a reshaped net brings more or fewer);
        # output_shapes checked the counts for these shapes
        num_priors = prior.shape[2] // 4
        pbox, pvar, _ = split_priors(prior, num_priors)
        check_prior_boxes(self, pbox, self.code_type)
        classes = [k for k in range(self.num_classes) if k != self.background]
        if not classes or num == 0:  # (a batch of 0: the fork's top is then 1x1x0x7)
            return self._no_detection(num, loc)
        labels = torch.tensor(classes, device=loc.device)
        boxes, scores = self._per_class(loc.detach(), conf.detach(), pbox, pvar, labels, num_priors)
        kc, p = scores.shape[1:]
        order, keep = _bbox.nms_fast(
            boxes.reshape(-1, p, 4),
            _bbox.box_size(boxes).reshape(-1, p),
            scores.reshape(-1, p),
            self.confidence_threshold,
            self.nms_threshold,
            self.eta,
            self.top_k,
        )
        order, keep = order.reshape(num, kc, -1), keep.reshape(num, kc, -1)
        picked = torch.gather(scores, 2, order)  # (N, C', K) scores in NMS order
        img, ci, ki = torch.nonzero(self._keep_top_k(keep, picked), as_tuple=True)
        if img.numel() == 0:
            return self._no_detection(num, loc)
        box = boxes[img, ci, order[img, ci, ki]]
        rows = torch.cat(
            [
                img.to(loc.dtype).unsqueeze(1),
                labels[ci].to(loc.dtype).unsqueeze(1),
                picked[img, ci, ki].to(loc.dtype).unsqueeze(1),
                box,
            ],
            1,
        )
        return rows.reshape(1, 1, -1, 7)

    def _per_class(self, loc, conf, pbox, pvar, labels, p: int):
        """Decoded boxes (N, C', P, 4) and scores (N, C', P) of the non-background classes."""
        num = loc.shape[0]
        loc = loc.reshape(num, p, self.loc_classes, 4).transpose(1, 2)  # (N, L, P, 4)
        boxes = _bbox.decode(pbox, pvar, loc, self.code_type, self.param.variance_encoded_in_target)
        scores = conf.reshape(num, p, self.num_classes).transpose(1, 2)  # (N, C, P)
        loc_labels = torch.zeros_like(labels) if self.share_location else labels
        return boxes[:, loc_labels], scores[:, labels]

    def _keep_top_k(self, keep: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
        """Per image, when more than keep_top_k survived NMS over all labels, only the
        keep_top_k highest scores (ties: lower label, then NMS order)."""
        num = keep.shape[0]
        flat = keep.reshape(num, -1)
        if self.keep_top_k <= -1 or flat.shape[1] <= self.keep_top_k:
            return keep
        ranked = torch.where(flat, picked.reshape(num, -1), float("-inf"))
        top = torch.sort(ranked, dim=1, descending=True, stable=True).indices
        chosen = torch.zeros_like(flat).scatter_(1, top[:, : self.keep_top_k], True)
        over = flat.sum(1, keepdim=True) > self.keep_top_k
        return torch.where(over, flat & chosen, flat).reshape(keep.shape)

    @staticmethod
    def _no_detection(num: int, like: torch.Tensor) -> torch.Tensor:
        """The fork's placeholder when no image has a detection: [i, -1, ..., -1] per image."""
        out = torch.full((num, 7), -1.0, dtype=like.dtype, device=like.device)
        out[:, 0] = torch.arange(num, dtype=like.dtype, device=like.device)
        return out.reshape(1, 1, num, 7)
