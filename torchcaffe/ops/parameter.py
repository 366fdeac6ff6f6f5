"""Parameter: a learnable blob of a given shape, exposed as the layer's top."""

from __future__ import annotations

import torch

from ..registry import register_layer
from .base import CaffeLayer, Exactly


@register_layer("Parameter")
class ParameterLayer(CaffeLayer):
    """A free blob. Caffe type ``Parameter``, ``parameter_param`` (shape).

    One param blob (``weight``) of ``shape``, zero-initialized as Caffe's fresh Blob; the top
    shares its data and its diff.
    Differs from torch: none (an nn.Parameter returned as the output).
    """

    param_field = "parameter_param"
    bottoms = Exactly(0)
    tops = Exactly(1)

    # param blobs, registered by add_blob
    weight: torch.Tensor

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        shape = [int(d) for d in self.param.shape.dim]
        if any(d < 0 for d in shape):
            raise self.error("shape dims must be non-negative", expected="dims >= 0", got=shape)
        self.add_blob("weight", shape)

    def forward(self) -> torch.Tensor:
        return self.weight.view_as(self.weight)
