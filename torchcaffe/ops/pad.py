"""Pad (brocolli-caffe): constant, replicate or reflect padding of H and W."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..proto import caffe_pb2
from ..registry import register_layer
from .base import CaffeLayer, Shape

_MODES = {
    caffe_pb2.PadParameter.CONSTANT: "constant",
    caffe_pb2.PadParameter.REPLICATE: "replicate",
    caffe_pb2.PadParameter.REFLECT: "reflect",
}


@register_layer("Pad", fork="brocolli")
class PadLayer(CaffeLayer):
    """Spatial padding. Caffe type ``Pad`` (brocolli-caffe), ``pad_param`` (pad_type CONSTANT /
    REPLICATE / REFLECT, pad_u, pad_d, pad_l, pad_r, pad_value).

    Pads H by pad_u above and pad_d below, W by pad_l left and pad_r right, of an
    N x C x H x W bottom. REFLECT mirrors without repeating the edge (pad < size). When all
    four pads are negative the layer crops instead, as the fork does. Forward only: the
    fork's backward is empty, so no gradient flows through (as there). Not in-place.
    Differs from torch: none (F.pad with the same modes).
    """

    param_field = "pad_param"
    has_backward = False
    restrictions = (
        "4-D bottoms only (the fork sizes 2-D and 3-D tops but its forward reads "
        "them as 4-D); negative pads only all four together (a crop), as the "
        "fork's forward handles no other mix"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        if layer_param.top and layer_param.bottom and layer_param.top[0] == layer_param.bottom[0]:
            raise self.error(
                "Pad does not allow in-place computation",
                expected="a top named unlike its bottom",
                got=layer_param.top[0],
            )
        p = self.param
        self.pads = (p.pad_u, p.pad_d, p.pad_l, p.pad_r)
        self.mode = _MODES[p.pad_type]
        self.crop = all(v < 0 for v in self.pads)
        if not self.crop and any(v < 0 for v in self.pads):
            raise self.error(
                "negative pads must be all four together (a crop)",
                expected="pad_u, pad_d, pad_l, pad_r all >= 0 or all < 0",
                got=list(self.pads),
            )
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        if len(shape) != 4:
            raise self.error("bottom must be 4-D", expected="N x C x H x W", got=list(shape))
        u, d, left, right = self.pads
        n, c, h, w = shape
        if self.mode == "reflect" and not self.crop and (max(u, d) >= h or max(left, right) >= w):
            raise self.error(
                "REFLECT padding must be smaller than the padded dimension",
                expected=f"pad_u, pad_d < {h} and pad_l, pad_r < {w}",
                got=list(self.pads),
            )
        if self.mode == "replicate" and not self.crop and min(c, h, w) == 0:
            raise self.error(
                "REPLICATE padding needs a non-empty bottom (there is no edge value to repeat)",
                expected="channels, height and width > 0",
                got=list(shape),
            )
        top = (n, c, h + u + d, w + left + right)
        if min(top) <= 0 and self.crop:
            raise self.error(
                "the crop leaves nothing", expected="a positive top size", got=list(top)
            )
        return [top]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach()
        u, d, left, right = self.pads
        if self.crop:
            h, w = x.shape[2] + u + d, x.shape[3] + left + right
            return x[:, :, -u : -u + h, -left : -left + w].contiguous()
        if self.mode == "constant":
            return F.pad(x, (left, right, u, d), mode="constant", value=self.param.pad_value)
        return F.pad(x, (left, right, u, d), mode=self.mode)
