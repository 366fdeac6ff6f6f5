"""InnerProduct: fully connected layer over the axes from ``axis`` on."""

from __future__ import annotations

import math

import torch

from ..registry import register_layer
from . import fused_relu, onednn_linear
from .base import CaffeLayer, canonical_axis


@register_layer("InnerProduct")
class InnerProductLayer(CaffeLayer):
    """y = x W^T + b over flattened trailing axes. Caffe type ``InnerProduct``,
    ``inner_product_param``.

    Output shape: bottom.shape[:axis] + (num_output,). Weight blob is (num_output, K), or
    (K, num_output) with ``transpose: true``; bias blob is (num_output,).
    """

    param_field = "inner_product_param"

    # param blobs, registered by add_blob
    weight: torch.Tensor
    bias: torch.Tensor

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if p.num_output <= 0:
            raise self.error("num_output must be positive", expected="> 0", got=p.num_output)
        shape = self.bottom_shapes[0]
        self.axis = canonical_axis(self, p.axis, len(shape))
        self.k = math.prod(shape[self.axis :])
        self.transpose = p.transpose
        wshape = (self.k, p.num_output) if p.transpose else (p.num_output, self.k)
        self.add_blob("weight", wshape, filler=p.weight_filler)
        if p.bias_term:
            self.add_blob("bias", (p.num_output,), filler=p.bias_filler)

    def output_shapes(self, bottom_shapes):
        """Caffe's Reshape check, once per input shape (``forward`` repeats none of it)."""
        shape = tuple(int(d) for d in bottom_shapes[0])
        k = math.prod(shape[self.axis :])
        if len(shape) <= self.axis or k != self.k:
            raise self.error(
                "input size incompatible with inner product parameters",
                expected=f"{self.k} values from axis {self.axis} on",
                got=k,
            )
        return [(*shape[: self.axis], self.param.num_output)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """On oneDNN's matmul where the weight is large (``onednn_linear``). The product is
        returned itself where it has the top's shape (axis 1): an in-place ReLU on a view of
        it would make autograd copy it back in the backward."""
        return self.top_with_relu(x, None)

    def top_with_relu(self, x: torch.Tensor, slope: fused_relu.Slope) -> torch.Tensor:
        """The top, then a ReLU of ``slope`` if any, fused into oneDNN's product where it
        runs (``fused_relu``; inference only)."""
        lead = x.shape[: self.axis]
        weight = self.weight.t() if self.transpose else self.weight
        bias = self.bias if self.param.bias_term else None
        # flattened by the layer's axis, not to (-1, k): a top whose shape a data or Python
        # layer changed at run time must not be regrouped into other rows
        flat = x.flatten(self.axis)
        if flat.dim() != 2:
            flat = flat.reshape(-1, flat.shape[-1])
        try:
            y = onednn_linear.linear(flat, weight, bias, slope)
        except RuntimeError:
            if flat.shape[-1] == self.k:
                raise
            raise self.error(
                "input size incompatible with inner product parameters",
                expected=f"{self.k} values from axis {self.axis} on",
                got=flat.shape[-1],
            ) from None
        return y if len(lead) == 1 else y.view(*lead, y.shape[-1])  # (no -1: a batch of 0)
