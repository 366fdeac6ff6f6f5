"""PReLU: ReLU with a learned slope for the negative side, per channel or shared."""

from __future__ import annotations

import torch

from ..proto import caffe_pb2
from ..registry import register_layer
from .neuron import NeuronLayer


@register_layer("PReLU")
class PReLULayer(NeuronLayer):
    """y = x if x > 0 else a * x. Caffe type ``PReLU``, ``prelu_param`` (filler: constant
    0.25, channel_shared = false).

    ``weight`` holds one slope per channel (axis 1), shape (C,), or a single one, shape ()
    with ``channel_shared``. Bottom: 2 to 4 axes (Caffe reads the channels through its legacy
    4-D accessor). In-place use is allowed.
    Differs from torch: at x == 0 the bottom gradient is the slope a (Caffe's x <= 0 side),
    and a's gradient sums x * top_diff over x <= 0; ``torch.where`` gives exactly that.
    """

    param_field = "prelu_param"

    # param blobs, registered by add_blob
    weight: torch.Tensor

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        shape = self.bottom_shapes[0]
        self._check_axes(len(shape))
        self.channel_shared = p.channel_shared
        filler = (
            p.filler
            if p.HasField("filler")
            else caffe_pb2.FillerParameter(type="constant", value=0.25)
        )
        self.add_blob("weight", () if self.channel_shared else (shape[1],), filler=filler)

    def _check_axes(self, ndim: int) -> None:
        if not 2 <= ndim <= 4:
            raise self.error(
                "bottom must have 2 to 4 axes (Caffe reads its channels through "
                "the legacy 4-D accessor)",
                expected="2 <= num_axes <= 4",
                got=ndim,
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_axes(x.dim())
        slope = self.weight
        if not self.channel_shared:
            if x.shape[1] != slope.shape[0]:
                raise self.error(
                    "bottom channels differ from the slope blob",
                    expected=slope.shape[0],
                    got=x.shape[1],
                )
            slope = slope.reshape((-1,) + (1,) * (x.dim() - 2))
        return torch.where(x > 0, x, slope * x)
