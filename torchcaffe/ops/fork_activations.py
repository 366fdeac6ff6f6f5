"""brocolli-caffe's conversion activations: ReLU6, HardSwish, HardSigmoid.

Element-wise like Caffe's NeuronLayer family. The fork's HardSwish and HardSigmoid have an
empty Backward_cpu, so no gradient flows through them here either.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import register_layer
from ._functional.relu6 import caffe_relu6
from .neuron import NeuronLayer


@register_layer("ReLU6", fork="brocolli")
class ReLU6Layer(NeuronLayer):
    """min(max(x, 0) + negative_slope * min(x, 0), threshold). Caffe type ``ReLU6``
    (brocolli-caffe), ``relu6_param`` (negative_slope, threshold).

    Gradient: (1 if x > 0 else negative_slope) where x < threshold, else 0 (0 at the threshold).
    Differs from torch: threshold and negative_slope are parameters (defaults 6 and 0 are
    torch's relu6, computed with hardtanh whose gradient is the fork's); otherwise a custom
    Function gives the fork's gradient, which masks on the input, not on the clipped output.
    """

    param_field = "relu6_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        self.negative_slope, self.threshold = p.negative_slope, p.threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.negative_slope == 0 and self.threshold >= 0:
            return F.hardtanh(x, 0.0, self.threshold)
        return caffe_relu6(x, self.negative_slope, self.threshold)


@register_layer("HardSwish", fork="brocolli")
class HardSwishLayer(NeuronLayer):
    """x * max(0, min(1, x / 6 + 0.5)). Caffe type ``HardSwish`` (brocolli-caffe); no params.

    Differs from torch: forward only (the fork's backward is empty); computed as the fork
    writes it, not as torch's x * relu6(x + 3) / 6.
    """

    has_backward = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach()
        return x * torch.clamp(x / 6.0 + 0.5, 0.0, 1.0)


@register_layer("HardSigmoid", fork="brocolli")
class HardSigmoidLayer(NeuronLayer):
    """max(0, min(1, alpha * x + beta)). Caffe type ``HardSigmoid`` (brocolli-caffe),
    ``hardsigmoid_param`` (alpha 0.2, beta 0.5).

    Differs from torch: forward only (the fork's backward is empty); alpha and beta are
    parameters (torch's hardsigmoid is alpha 1/6, beta 0.5).
    """

    param_field = "hardsigmoid_param"
    has_backward = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.param
        return torch.clamp(x.detach() * p.alpha + p.beta, 0.0, 1.0)
