"""SmoothL1Loss (Fast R-CNN family forks): smooth L1 of weighted regression differences."""

from __future__ import annotations

import torch

from ..registry import register_layer
from ._functional.smooth_l1 import smooth_l1, weighted_smooth_l1_fork
from ._loss_normalization import LossLayer, legacy_dim
from ._narrow import computed_in_float32
from .base import Between


@register_layer("SmoothL1Loss", fork="Fast/Faster R-CNN")
class SmoothL1LossLayer(LossLayer):
    """sum(w_out * f(w_in * (a - b))) / N with f(d) = 0.5 sigma^2 d^2 where |d| < 1 / sigma^2,
    else |d| - 0.5 / sigma^2. Caffe type ``SmoothL1Loss`` (py-faster-rcnn, SSD, brocolli),
    ``smooth_l1_loss_param`` (sigma, default 1).

    Bottoms: prediction a, target b, then optionally weights, all of the same
    channels/height/width: 2 bottoms (no weights); 4 bottoms (py-faster-rcnn: inside weights
    w_in and outside weights w_out, gradient w_out * w_in * f'(w_in (a - b))); 3 bottoms
    (the SSD / brocolli fork: w_in only, and that fork's gradient is f'(w_in (a - b))
    without the w_in factor). a and b get gradients (+- loss_weight / N), the weights none.
    Differs from torch: smooth_l1_loss(beta=1 / sigma^2) * beta summed over elements / N, plus
    the weight bottoms.
    """

    param_field = "smooth_l1_loss_param"
    bottoms = Between(2, 4)
    no_force_backward = frozenset({2, 3})

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        shapes = self.bottom_shapes
        if any(len(s) > 4 for s in shapes):
            raise self.error(
                "SmoothL1Loss bottoms must have at most 4 axes",
                expected="<= 4 axes",
                got=[len(s) for s in shapes],
            )
        for i, s in enumerate(shapes[1:], start=1):
            for k, name in ((1, "channels"), (2, "height"), (3, "width")):
                if legacy_dim(s, k) != legacy_dim(shapes[0], k):
                    raise self.error(
                        f"bottom {i} {name} differs from bottom 0",
                        expected=legacy_dim(shapes[0], k),
                        got=legacy_dim(s, k),
                    )
            if i >= 2 and legacy_dim(s, 0) != legacy_dim(shapes[0], 0):
                raise self.error(
                    f"bottom {i} (weights) num differs from bottom 0",
                    expected=legacy_dim(shapes[0], 0),
                    got=legacy_dim(s, 0),
                )
        sigma = self.param.sigma
        self.sigma2 = float(torch.tensor(sigma, dtype=torch.float32) ** 2)  # Dtype sigma^2

    # a 16-bit net's loss in float32, rounded once (ops/_narrow.py)
    @computed_in_float32
    def forward(self, a: torch.Tensor, b: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        d = a - b.reshape(a.shape)
        w = [t.detach().reshape(a.shape) for t in weights]
        if len(w) == 1:
            errors = weighted_smooth_l1_fork(d, w[0], self.sigma2)
        elif len(w) == 2:
            errors = smooth_l1(w[0] * d, self.sigma2) * w[1]
        else:
            errors = smooth_l1(d, self.sigma2)
        return errors.sum() / a.shape[0]
