"""InfogainLoss: softmax cross-entropy weighted by an infogain matrix H."""

from __future__ import annotations

import math

import torch

from ..errors import TorchCaffeError
from ..formats.binaryproto import blob_proto_to_array, read_blob_proto
from ..registry import register_layer
from ._functional.clamped_log import log_softmax_clamped
from ._loss_normalization import (
    LOG_THRESHOLD,
    LossLayer,
    check_label_count,
    check_labels,
    ignore_label,
    normalizer,
    params_repr,
    summed,
)
from .base import Between, canonical_axis


@register_layer("InfogainLoss")
class InfogainLossLayer(LossLayer):
    """-sum over counted labels y of sum_l H[y, l] log(max(softmax(x)_l, 1e-20)) / normalizer.
    Caffe type ``InfogainLoss``, ``infogain_loss_param`` (source, axis) and ``loss_param``
    (ignore_label, normalization; the deprecated ``normalize`` is rejected, as in Caffe).

    Bottoms: scores (softmax over ``axis``), labels (count = outer * inner), and optionally
    H (C x C values); without the third bottom H is read from the BlobProto file ``source``
    (relative to the working directory, as Caffe reads it). Tops: the scalar loss,
    optionally the probabilities. Normalizer as SoftmaxWithLoss (default VALID), at least 1.
    Differs from torch: Caffe's gradient (prob * sum_l H[y, l] - H[y, :]) * loss_weight /
    normalizer ignores the probability clamp; H, the labels and the probabilities top get
    no gradient.
    """

    param_field = "infogain_loss_param"
    bottoms = Between(2, 3)
    tops = Between(1, 2)
    infogain: torch.Tensor  # buffer from infogain_loss_param.source (absent with 3 bottoms)
    refused_bottoms = frozenset({1, 2})  # LOG(FATAL): label and infogain inputs

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        loss_param = layer_param.loss_param
        if loss_param.HasField("normalize"):
            raise self.error(
                "loss_param.normalize is deprecated for InfogainLoss",
                expected="loss_param.normalization",
                got="normalize",
            )
        self.ignore_label = ignore_label(loss_param)
        self.normalization = loss_param.normalization
        shape = self.bottom_shapes[0]
        self.axis = canonical_axis(self, self.param.axis, len(shape), "infogain_loss_param.axis")
        check_label_count(self, shape, self.bottom_shapes[1], self.axis)
        channels = shape[self.axis]
        if len(self.bottom_shapes) == 3:
            self._check_h(math.prod(self.bottom_shapes[2]), channels, "bottom 2")
        else:
            if not self.param.HasField("source"):
                raise self.error(
                    "infogain matrix source must be specified",
                    expected="infogain_loss_param.source or a third bottom (H)",
                    got="neither",
                )
            try:
                h = blob_proto_to_array(read_blob_proto(self.param.source), path=self.param.source)
            except TorchCaffeError as err:
                raise err.located(layer=self.name, layer_type=self.caffe_type) from None
            self._check_h(h.size, channels, f"source {self.param.source!r}")
            self.register_buffer(
                "infogain",
                torch.as_tensor(h, dtype=torch.float32).reshape(channels, channels),
                persistent=False,
            )

    def _check_h(self, count: int, channels: int, where: str) -> None:
        if count != channels * channels:
            raise self.error(
                f"infogain matrix ({where}) must be {channels}x{channels}",
                expected=f"{channels * channels} values",
                got=count,
            )

    def extra_repr(self) -> str:
        return params_repr(self, "infogain_loss_param", "loss_param")

    def forward(self, x: torch.Tensor, label: torch.Tensor, h: torch.Tensor | None = None):
        check_label_count(self, x.shape, label.shape, self.axis)
        outer, channels = math.prod(x.shape[: self.axis]), x.shape[self.axis]
        inner = math.prod(x.shape[self.axis + 1 :])
        if h is None:
            h = self.infogain
        else:
            self._check_h(h.numel(), channels, "bottom 2")
        h = h.detach().reshape(channels, channels).to(x.dtype)
        log_prob, prob = log_softmax_clamped(x, self.axis, LOG_THRESHOLD)
        labels = label.detach().reshape(outer, inner).long()
        valid = None if self.ignore_label is None else labels != self.ignore_label
        check_labels(self, labels, valid, channels)
        safe = labels if valid is None else torch.where(valid, labels, 0)
        rows = h[safe].transpose(1, 2)  # (outer, C, inner): H[label, l]
        if valid is not None:
            rows = torch.where(valid.unsqueeze(1), rows, 0.0)
        total = -summed(rows * log_prob.reshape(outer, channels, inner))
        loss = (total / normalizer(self.normalization, outer, inner, valid, total)).to(x.dtype)
        return (loss, prob) if self.num_tops == 2 else loss
