"""Accuracy: top-k classification accuracy, optionally per class (no backward)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..registry import register_layer
from ._loss_normalization import check_label_count, check_labels, ignore_label
from .base import Between, CaffeLayer, Exactly, Shape, canonical_axis


@register_layer("Accuracy")
class AccuracyLayer(CaffeLayer):
    """Fraction of counted labels whose score is among the ``top_k`` best. Caffe type
    ``Accuracy``, ``accuracy_param`` (top_k, axis, ignore_label).

    A label is correct when fewer than ``top_k`` scores along ``axis`` are >= its own score
    besides itself, so ties count against it. Labels equal to ``ignore_label`` are skipped;
    no counted label gives 0. Tops: the scalar accuracy, optionally the per-class accuracy
    (shape (C,), 0 for classes without labels). No backward, as in Caffe.
    Differs from torch: no torch equivalent.
    """

    param_field = "accuracy_param"
    bottoms = Exactly(2)
    tops = Between(1, 2)
    has_backward = False
    refused_bottoms = frozenset({0, 1})  # Backward: NOT_IMPLEMENTED where propagate_down

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        shape, label_shape = self.bottom_shapes
        self.top_k = p.top_k
        self._check_top_k(shape, label_shape)
        self.axis = canonical_axis(self, p.axis, len(shape))
        self.ignore_label = ignore_label(p)
        check_label_count(self, shape, label_shape, self.axis)

    def _check_top_k(self, shape: Sequence[int], label_shape: Sequence[int]) -> None:
        """Caffe checks this in Reshape, so a later, smaller bottom is refused too."""
        classes = math.prod(shape) // max(1, math.prod(label_shape))
        if self.top_k > classes:
            raise self.error(
                "top_k must be less than or equal to the number of classes",
                expected=f"<= {classes} (bottom 0 count / label count)",
                got=self.top_k,
            )

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        return [(), (int(bottom_shapes[0][self.axis]),)][: self.num_tops]

    def forward(self, x: torch.Tensor, label: torch.Tensor):
        self._check_top_k(x.shape, label.shape)
        check_label_count(self, x.shape, label.shape, self.axis)
        x = x.detach()
        outer, channels = math.prod(x.shape[: self.axis]), x.shape[self.axis]
        scores = x.reshape(outer, channels, -1)
        labels = label.detach().reshape(outer, 1, -1).long()
        valid = None if self.ignore_label is None else labels != self.ignore_label
        check_labels(self, labels, valid, channels)
        safe = labels if valid is None else torch.where(valid, labels, 0)
        true_score = scores.gather(1, safe)
        better = (scores >= true_score).sum(dim=1, keepdim=True) - 1  # the label's own counts
        correct = better < self.top_k
        counted = torch.ones_like(correct) if valid is None else valid
        correct = correct & counted
        count = counted.sum()
        accuracy = torch.where(count > 0, correct.sum().to(x.dtype) / count.clamp(min=1), 0.0)
        if self.num_tops == 1:
            return accuracy
        classes = torch.arange(channels, device=x.device).reshape(1, channels, 1)
        is_class = (safe == classes) & counted
        nums = is_class.sum(dim=(0, 2)).to(x.dtype)
        hits = (is_class & correct).sum(dim=(0, 2)).to(x.dtype)
        per_class = torch.where(nums > 0, hits / nums.clamp(min=1), 0.0)
        return accuracy, per_class
