"""Embed: a lookup table (one-hot input times a weight matrix), plus an optional bias."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..registry import register_layer
from ._loss_normalization import index_checks_wanted
from .base import CaffeLayer, Shape


@register_layer("Embed")
class EmbedLayer(CaffeLayer):
    """top[..., :] = weight[int(x[...])] + bias. Caffe type ``Embed``, ``embed_param``
    (num_output, input_dim, bias_term = true, weight_filler, bias_filler).

    Output shape: bottom.shape + (num_output,). Weight blob is (input_dim, num_output) (the
    transpose of InnerProduct's), bias (num_output,). Indices are floats cast toward 0; an
    index outside [0, input_dim) is an error. The index bottom gets no gradient; repeated
    indices accumulate into the weight's gradient.
    Differs from torch: none (F.embedding on the truncated indices).
    """

    param_field = "embed_param"
    refused_bottoms = frozenset({0})  # CHECK: "Can't backpropagate to EmbedLayer input."

    # param blobs, registered by add_blob
    weight: torch.Tensor
    bias: torch.Tensor

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if p.num_output <= 0:
            raise self.error("num_output must be positive", expected="> 0", got=p.num_output)
        if p.input_dim <= 0:
            raise self.error("input_dim must be positive", expected="> 0", got=p.input_dim)
        self.num_output, self.input_dim, self.bias_term = p.num_output, p.input_dim, p.bias_term
        self.add_blob("weight", (p.input_dim, p.num_output), filler=p.weight_filler)
        if p.bias_term:
            self.add_blob("bias", (p.num_output,), filler=p.bias_filler)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        return [tuple(int(d) for d in bottom_shapes[0]) + (self.num_output,)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = x.detach().long()  # static_cast<int>: truncation toward 0
        if index.numel() and index_checks_wanted(index):
            bad = (index < 0) | (index >= self.input_dim)
            if bool(bad.any()):
                raise self.error(
                    "index out of range for the embedding",
                    expected=f"0 <= index < input_dim ({self.input_dim})",
                    got=x.detach()[bad].tolist()[:5],
                )
        top = F.embedding(index, self.weight)
        return top + self.bias if self.bias_term else top
