"""Input: declares net input blobs and their shapes (InputParameter)."""

from __future__ import annotations

import torch

from .. import limits
from ..registry import register_layer
from .base import AtLeast, CaffeLayer, Exactly


@register_layer("Input")
class InputLayer(CaffeLayer):
    """Net inputs. Caffe type ``Input``, ``input_param { shape {...} }``.

    One shape serves every top, or one shape per top. The Net feeds these tops; called
    directly, the layer returns zero-filled blobs of the declared shapes (Caffe's fresh blobs).
    """

    bottoms = Exactly(0)
    tops = AtLeast(1)
    param_field = "input_param"
    has_backward = False

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        shapes = self.param.shape
        if len(shapes) not in (0, 1, self.num_tops):
            raise self.error(
                "input_param must give 0, 1 or one shape per top",
                expected=f"0, 1 or {self.num_tops} shapes",
                got=len(shapes),
            )
        if len(shapes) == 1:
            dims = [tuple(shapes[0].dim)] * self.num_tops
        elif len(shapes) == 0:
            dims = [()] * self.num_tops
        else:
            dims = [tuple(s.dim) for s in shapes]
        for d in dims:
            if any(x < 0 for x in d):
                raise self.error("negative input dimension", expected=">= 0", got=d)
            problem = limits.shape_problem(d)
            if problem:
                raise self.error(
                    f"input shape {limits.shape_text(d)}: {problem}",
                    hint="see docs/limits.md to raise a limit for a net you trust",
                )
        self.shapes = [tuple(int(x) for x in d) for d in dims]

    def output_shapes(self, bottom_shapes):
        return list(self.shapes)

    def forward(self):
        tops = tuple(torch.zeros(s) for s in self.shapes)
        return tops if len(tops) > 1 else tops[0]
