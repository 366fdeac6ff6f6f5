"""HingeLoss: one-vs-all hinge loss (L1 or squared L2) for classification."""

from __future__ import annotations

import math

import torch

from ..proto import caffe_pb2
from ..registry import register_layer
from ._loss_normalization import LossLayer, check_labels
from ._narrow import computed_in_float32

L1, L2 = caffe_pb2.HingeLossParameter.L1, caffe_pb2.HingeLossParameter.L2


@register_layer("HingeLoss")
class HingeLossLayer(LossLayer):
    """sum over n, k of max(0, 1 - d_nk x_nk)^p / N, d = +1 for the label, -1 otherwise;
    p = 1 (``norm: L1``) or 2 (``norm: L2``). Caffe type ``HingeLoss``, ``hinge_loss_param``.

    Scores are bottom 0 flattened to (N, count / N); bottom 1 holds one label per item (its
    first N values are read).
    Differs from torch: multi_margin_loss is a different (one-vs-rest, summed over the
    label) formula; the gradient here is the mathematical one, 0 at the hinge.
    """

    param_field = "hinge_loss_param"
    refused_bottoms = frozenset({1})  # LOG(FATAL): cannot backpropagate to label inputs

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self.norm = self.param.norm
        if self.norm not in (L1, L2):
            raise self.error("unknown norm", expected="L1 or L2", got=self.norm)

    # a 16-bit net's loss in float32, rounded once (ops/_narrow.py)
    @computed_in_float32
    def forward(self, x: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        num = x.shape[0]
        dim = math.prod(x.shape[1:])
        scores = x.reshape(num, dim)
        labels = label.detach().reshape(-1)[:num].long().reshape(num, 1)
        check_labels(self, labels, None, dim)
        is_label = torch.arange(dim, device=x.device).reshape(1, dim) == labels
        margin = torch.relu(1 + torch.where(is_label, -scores, scores))
        if self.norm == L1:
            return margin.sum() / num
        return (margin * margin).sum() / num
