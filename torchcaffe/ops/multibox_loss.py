"""MultiBoxLoss (SSD fork): match priors to ground truth, mine negatives, loc + conf loss."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..errors import DataError, UnsupportedError
from ..proto import caffe_pb2
from ..registry import register_layer
from . import _bbox, _multibox
from ._functional.clamped_log import log_softmax_clamped
from ._loss_normalization import FLT_MIN, normalization_mode, params_repr
from ._narrow import computed_in_float32
from .base import CaffeLayer, Exactly, Shape
from .detection_output import check_prior_boxes, check_prior_counts, split_priors

MB = caffe_pb2.MultiBoxLossParameter
Norm = caffe_pb2.LossParameter


@register_layer("MultiBoxLoss", fork="SSD")
class MultiBoxLossLayer(CaffeLayer):
    """SSD training loss: (loc_weight * loc loss + conf loss) / normalizer.
    Caffe type ``MultiBoxLoss`` (SSD fork), ``multibox_loss_param`` and ``loss_param``.

    Bottoms: loc (N, P*L*4), conf (N, P*C), priors (1, 2, P*4), labels (1, 1, G, 8) rows
    [image, class, instance, xmin, ymin, xmax, ymax, difficult]. Priors (or the decoded loc
    when use_prior_for_matching is false) are matched to the ground truth (bipartite, then
    PER_PREDICTION at overlap_threshold); MAX_NEGATIVE mining keeps the neg_pos_ratio * pos
    highest-loss unmatched priors with overlap < neg_overlap, HARD_EXAMPLE the sample_size
    highest loc + conf losses. Loc loss: SmoothL1 (or half squared L2) of the matched
    predictions against the encoded ground truth, summed. Conf loss: summed softmax (FLT_MIN
    clamp) or logistic loss of the matched and mined priors (all priors without mining).
    Normalizer from loss_param.normalization (VALID: the number of matches), at least 1. A
    term whose bottom has propagate_down false is left out of the loss, as in the fork.
    Gradients flow to loc and conf only.
    Differs from torch: no torch equivalent; the fork's gradients are kept (softmax through the
    FLT_MIN clamp; with encode_variance_in_target the loc gradient is not divided by the
    variance; LOGISTIC without mining places its targets with the fork's per-image stride of
    P, not P*C). Mined losses that tie go to the lower prior index (the fork's std::sort
    leaves them unspecified).
    """

    param_field = "multibox_loss_param"
    bottoms = Exactly(4)
    is_loss = True
    # LossLayer denies force_backward to bottom 1 (conf); the fork aborts when asked to
    # backpropagate to the priors or the labels, which simply get no gradient here.
    no_force_backward = frozenset({1, 2, 3})
    host_forward = "it matches priors to ground-truth boxes in Python on the host"
    restrictions = (
        "mining with nms_param (nms_threshold > 0) is unsupported; forcing "
        "backward into the prior and label bottoms gives them no gradient, where "
        "the fork aborts"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        self._check_classes(p)
        self._check_mining(p)
        self.normalization = normalization_mode(self)
        flags = list(layer_param.propagate_down)  # the fork defaults them to [1, 1, 0, 0]
        self.use_loc, self.use_conf = (bool(flags[0]), bool(flags[1])) if flags else (True, True)
        check_prior_counts(self, self.bottom_shapes, self.loc_classes, self.num_classes)
        self._check_labels_shape(self.bottom_shapes[3])
        self.keys = (
            [-1]
            if p.share_location
            else [c for c in range(self.num_classes) if c != self.background]
        )

    def complete_param(self, lp: caffe_pb2.LayerParameter) -> None:
        """The fork's LayerSetUp: LossLayer's loss_weight 1, and propagate_down 1, 1, 0, 0
        when the prototxt gives none."""
        if not lp.loss_weight:
            lp.loss_weight.append(1.0)
        if not lp.propagate_down:
            lp.propagate_down.extend([True, True, False, False])

    # -- LayerSetUp checks ----------------------------------------------------------------
    def _check_classes(self, p) -> None:
        if not p.HasField("num_classes") or p.num_classes < 1:
            raise self.error(
                "must provide num_classes",
                expected="num_classes >= 1",
                got=p.num_classes if p.HasField("num_classes") else None,
            )
        self.num_classes = p.num_classes
        self.loc_classes = 1 if p.share_location else p.num_classes
        self.background = _bbox.label_id(p.background_label_id)  # uint32 read as int
        if p.conf_loss_type == MB.SOFTMAX and not 0 <= self.background < self.num_classes:
            raise self.error(
                "background_label_id should be within [0, num_classes) for Softmax",
                expected=f"0 <= id < {self.num_classes}",
                got=self.background,
            )
        if p.map_object_to_agnostic:
            want = 2 if self.background >= 0 else 1
            if self.num_classes != want:
                raise self.error(
                    "map_object_to_agnostic needs one object class (plus the "
                    "background when background_label_id >= 0)",
                    expected=f"num_classes: {want}",
                    got=self.num_classes,
                )

    def _check_mining(self, p) -> None:
        mining = self.mining = p.mining_type
        if p.HasField("do_neg_mining") and p.do_neg_mining != (mining != MB.NONE):
            raise self.error(
                "do_neg_mining (deprecated) contradicts mining_type",
                expected=f"do_neg_mining: {str(mining != MB.NONE).lower()}",
                got=str(p.do_neg_mining).lower(),
            )
        if mining == MB.NONE:
            return
        if not p.share_location:
            raise self.error(
                "negative mining needs share_location: true",
                expected="share_location: true or mining_type: NONE",
                got=False,
            )
        if not self.background < self.num_classes:
            raise self.error(
                "mining needs background_label_id < num_classes",
                expected=f"< {self.num_classes}",
                got=self.background,
            )
        if mining == MB.HARD_EXAMPLE and p.sample_size <= 0:
            raise self.error(
                "HARD_EXAMPLE mining needs sample_size > 0", expected="> 0", got=p.sample_size
            )
        if p.HasField("nms_param") and p.nms_param.nms_threshold > 0:
            raise self.error(
                "mining with nms_param is not supported",
                hint="remove nms_param from multibox_loss_param",
                cls=UnsupportedError,
            )

    def _check_labels_shape(self, shape: Shape) -> None:
        if len(shape) != 4 or shape[3] != 8:
            raise self.error(
                "bottom 3 (labels) must be (1, 1, num_gt, 8)",
                expected="(1, 1, num_gt, 8)",
                got=tuple(shape),
            )

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        check_prior_counts(self, bottom_shapes, self.loc_classes, self.num_classes)
        self._check_labels_shape(bottom_shapes[3])
        return [()]

    def extra_repr(self) -> str:
        return params_repr(self, "multibox_loss_param", "loss_param")

    # -- Forward --------------------------------------------------------------------------
    # a float16 sum of the confidence losses over every prior passes 65504 (SSD300: 8732
    # priors an image) and FLT_MIN is 0 there; matching and mining in 16-bit overlaps move
    # too: a 16-bit net computes this loss in float32, rounding it once
    @computed_in_float32
    def forward(self, loc, conf, prior, label):
        p, num = self.param, loc.shape[0]
        # the fork's Reshape recounts the priors (a reshaped net brings more or fewer);
        # output_shapes checked the counts for these shapes
        num_priors = prior.shape[2] // 4
        prior_t = split_priors(prior, num_priors)
        if not p.use_prior_for_matching:
            check_prior_boxes(self, prior_t[0], p.code_type)
        loc_r = loc.reshape(num, num_priors, self.loc_classes, 4)
        conf_r = conf.reshape(num, num_priors, self.num_classes)
        # the fork reads bottom[3]->height() rows of 8 values
        truth = _multibox.read_ground_truth(
            self, label.reshape(-1)[: label.shape[2] * 8], num, p.use_difficult_gt
        )
        match, overlaps = _multibox.find_matches(p, self.keys, truth, loc_r, prior_t)
        loc_pair = _multibox.encode_loc(p, self.keys, truth, loc_r, prior_t, match)
        neg = None
        if self.mining != MB.NONE:
            match, neg = self._mine(conf_r, loc_pair, match, overlaps, truth)
            if self.mining == MB.HARD_EXAMPLE:
                loc_pair = _multibox.encode_loc(p, self.keys, truth, loc_r, prior_t, match)
        norm = self._normalizer(num, num_priors, (match > -1).sum())
        loss = loc.reshape(-1)[:0].sum() + conf.reshape(-1)[:0].sum()  # 0, on the graph
        if self.use_loc and loc_pair[0].numel():
            loss = loss + p.loc_weight * self._loc_loss(*loc_pair).sum() / norm
        if self.use_conf:
            loss = loss + self._conf_loss(conf_r, match, neg, truth) / norm
        return loss

    def _normalizer(self, num: int, num_priors: int, num_matches: torch.Tensor):
        """LossLayer::GetNormalizer with the match count as the valid count."""
        mode = self.normalization
        if mode == Norm.VALID:
            return num_matches.clamp(min=1)
        counts: dict[int, int] = {
            Norm.FULL: num * num_priors,
            Norm.BATCH_SIZE: num,
            Norm.NONE: 1,
        }
        return max(1, counts[mode])

    def _loc_loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Elementwise SmoothL1 (|d| < 1: d^2 / 2, else |d| - 1/2) or L2 (d^2 / 2)."""
        d = pred - target
        if self.param.loc_loss_type == MB.SMOOTH_L1:
            return torch.where(d.abs() < 1, 0.5 * d * d, d.abs() - 0.5)
        return 0.5 * d * d

    def _checked_labels(self, truth, match: torch.Tensor) -> torch.Tensor:
        """Labels of the matches; a matched label outside [0, num_classes) is an error."""
        labels = truth.label_of(match)
        bad = (match > -1) & ((labels < 0) | (labels >= self.num_classes))
        if bool(bad.any()):
            raise DataError(
                "matched ground truth label out of range",
                layer=self.name,
                layer_type=self.caffe_type,
                expected=f"labels in [0, {self.num_classes})",
                got=int(labels[bad].reshape(-1)[0]),
            )
        return labels

    def _mine(self, conf_r, loc_pair, match, overlaps, truth):
        """MineHardExamples (share_location: one key) -> (match, negatives (N, P))."""
        m = match[:, 0]
        label = torch.where(m > -1, self._checked_labels(truth, m), self.background)
        loss = self._conf_per_prior(conf_r.detach(), label).float()
        if self.mining == MB.HARD_EXAMPLE and loc_pair[0].numel():
            loc_loss = torch.zeros_like(loss)
            loc_loss[m > -1] = self._loc_loss(loc_pair[0].detach(), loc_pair[1]).sum(-1).float()
            loss = loss + loc_loss
        has_gt = torch.tensor([n > 0 for n in truth.count], device=m.device)
        m, neg = _multibox.select_examples(self.param, loss, m, overlaps[:, 0], has_gt)
        return m.unsqueeze(1), neg

    def _conf_per_prior(self, x: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """ComputeConfLoss: the per-prior confidence loss that mining ranks."""
        if self.param.conf_loss_type == MB.SOFTMAX:
            prob = torch.softmax(x, -1).gather(-1, label.unsqueeze(-1)).squeeze(-1)
            return -torch.log(prob.clamp(min=FLT_MIN))
        onehot = torch.arange(x.shape[-1], device=x.device) == label.unsqueeze(-1)
        return F.binary_cross_entropy_with_logits(x, onehot.to(x.dtype), reduction="none").sum(-1)

    def _conf_labels(self, truth, match: torch.Tensor) -> torch.Tensor:
        """Per key, the class each matched prior is trained to (-1: unmatched)."""
        if self.param.map_object_to_agnostic:
            return torch.where(match > -1, self.background + 1, -1)
        return self._checked_labels(truth, match)

    def _conf_loss(self, conf_r, match, neg, truth) -> torch.Tensor:
        """EncodeConfPrediction + the SoftmaxWithLoss / SigmoidCrossEntropyLoss sum."""
        num, p, c = conf_r.shape
        labels = self._conf_labels(truth, match)  # (N, K, P)
        softmax = self.param.conf_loss_type == MB.SOFTMAX
        if neg is not None:  # mining: the matched and the mined priors only
            pos = labels[:, 0] > -1
            used = pos | neg
            x, lab = conf_r[used], torch.where(pos, labels[:, 0], self.background)[used]
        elif softmax:  # every prior; a later key's label wins, as the fork's loop writes
            lab = torch.full((num, p), self.background, dtype=torch.long, device=conf_r.device)
            for k in range(labels.shape[1]):
                lab = torch.where(labels[:, k] > -1, labels[:, k], lab)
            x, lab = conf_r.reshape(-1, c), lab.reshape(-1)
        else:
            return self._logistic_all_priors(conf_r, labels)
        if softmax:
            log_prob, _ = log_softmax_clamped(x, 1, FLT_MIN)
            return -log_prob.gather(1, lab.unsqueeze(1)).sum()
        onehot = torch.arange(c, device=x.device) == lab.unsqueeze(1)
        target = torch.where(onehot, 1.0, float(self.background)).to(x.dtype)
        return F.binary_cross_entropy_with_logits(x, target, reduction="sum")

    def _logistic_all_priors(self, conf_r, labels) -> torch.Tensor:
        """LOGISTIC without mining: targets start at background_label_id everywhere and a
        match sets 1 at i * P + j * C + label (the fork advances its target pointer by P,
        not P * C, per image)."""
        num, p, c = conf_r.shape
        target = torch.full(
            (num * p * c,), float(self.background), dtype=conf_r.dtype, device=conf_r.device
        )
        for k in range(labels.shape[1]):
            img, j = torch.nonzero(labels[:, k] > -1, as_tuple=True)
            target[img * p + j * c + labels[img, k, j]] = 1.0
        return F.binary_cross_entropy_with_logits(conf_r.reshape(-1), target, reduction="sum")
