"""The made-up fork's ``ChannelGate`` layer, written in Python against torchcaffe.

Registering the class is all it takes: the layer reads ``channel_gate_param`` from the fork's
caffe.proto (``self.param`` is the fork's ChannelGateParameter message), creates its param blob
with ``add_blob`` (so weights I/O, the Caffe face and the solver see it), and gets its backward
from autograd.
"""

from __future__ import annotations

import torch

import torchcaffe
from torchcaffe.ops.base import CaffeLayer, Exactly
from torchcaffe.proto import caffe_pb2


@torchcaffe.register_layer("ChannelGate", fork="examples/forks")
class ChannelGateLayer(CaffeLayer):
    """y = x * sigmoid(gate[c] + gate_bias); one learnable gate per channel (axis 1)."""

    bottoms = Exactly(1)
    tops = Exactly(1)
    param_field = "channel_gate_param"  # a LayerParameter field only the fork's schema has

    gate: torch.Tensor

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param  # the fork's ChannelGateParameter
        self.gate_bias = float(p.gate_bias)
        filler = caffe_pb2.FillerParameter()
        if p.HasField("gate_filler"):  # the fork's FillerParameter, copied into ours by bytes
            filler.ParseFromString(p.gate_filler.SerializeToString())
        else:
            filler.type, filler.value = "constant", 0.0
        if len(self.bottom_shapes[0]) < 2:
            raise self.error("bottom needs a channel axis", expected=">= 2 axes", got=1)
        self.add_blob("gate", (self.bottom_shapes[0][1],), filler=filler)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.gate + self.gate_bias)
        return x * gate.reshape((-1,) + (1,) * (x.dim() - 2))
