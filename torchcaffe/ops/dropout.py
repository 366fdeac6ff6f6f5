"""Dropout: zero a random fraction of the input while training, as Caffe's DropoutLayer."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import register_layer
from .neuron import NeuronLayer


@register_layer("Dropout")
class DropoutLayer(NeuronLayer):
    """Random zeroing with keep probability 1 - dropout_ratio. Caffe type ``Dropout``,
    ``dropout_param`` (dropout_ratio; fork fields scale_train, sample_weights_test).

    Training (``self.training``, set from the phase): y = x * mask / (1 - dropout_ratio),
    mask ~ Bernoulli(1 - dropout_ratio), the gradient is the top diff times the same mask and
    scale. Testing: identity. Fork fields, as their Caffes implement them: ``scale_train:
    false`` (py-faster-rcnn) drops without rescaling while training and multiplies by
    1 - dropout_ratio while testing; ``sample_weights_test: true`` (Bayesian SegNet) keeps
    sampling masks while testing. The mask comes from torch's RNG, not Caffe's.
    Differs from torch: none beyond those fork fields.
    """

    param_field = "dropout_param"
    restrictions = "TRAIN masks follow Caffe's Bernoulli(1 - ratio) and scaling, not its RNG stream"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if not 0 <= p.dropout_ratio < 1:
            # Caffe DCHECKs 0 < ratio < 1; its Bernoulli draw CHECK-fails outside [0, 1] and
            # ratio 1 makes the scale 1 / (1 - ratio) infinite.
            raise self.error(
                "dropout_ratio out of range", expected="0 <= dropout_ratio < 1", got=p.dropout_ratio
            )
        self.dropout_ratio = p.dropout_ratio
        self.scale_train = p.scale_train
        self.sample_weights_test = p.sample_weights_test

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ratio = self.dropout_ratio
        if self.training or self.sample_weights_test:
            if self.scale_train:
                return F.dropout(x, ratio, training=True)
            return x * torch.empty_like(x).bernoulli_(1.0 - ratio)
        return x if self.scale_train else x * (1.0 - ratio)
