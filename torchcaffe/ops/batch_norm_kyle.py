"""BatchNormKyle (brocolli): BatchNorm with an optional per-channel scale and shift inside."""

from __future__ import annotations

import torch

from ..registry import register_layer
from .batch_norm import BatchNormLayer


@register_layer("BatchNormKyle", fork="brocolli")
class BatchNormKyleLayer(BatchNormLayer):
    """y = (x - mean) / sqrt(var + eps) [* alpha + beta] per channel (axis 1). Caffe type
    ``BatchNormKyle`` (brocolli-caffe batch_norm_kyle_layer.cpp), ``batch_norm_param``
    (use_global_stats: phase == TEST, moving_average_fraction = .999, eps = 1e-5,
    use_alpha_beta = false).

    Statistics, running sums and blobs 0-2 (``mean``, ``variance``, ``scale_factor``) are
    BatchNorm's; ``use_alpha_beta`` adds learned blobs 3, 4: ``alpha`` (C,) = 1 and
    ``beta`` (C,) = 0 (the fork ignores weight_filler / bias_filler). Unlike BVLC's
    BatchNorm, the fork accepts any ParamSpecs (it neither adds lr_mult: 0 specs nor checks
    them).
    Differs from torch: running sums with a scale factor; with global statistics Caffe's
    backward returns before computing alpha / beta diffs, so they get no gradient.
    """

    restrictions = (
        "alpha / beta diffs are accumulated; Caffe overwrites them (shows only "
        "with iter_size > 1 or shared params). Blobs 0-2 are buffers; Caffe "
        "leaves them solver-visible with their ParamSpec's lr_mult / decay_mult, "
        "so weight decay there would shrink the running statistics. A negative eps "
        "is not supported"
    )

    # param blobs, registered by add_blob
    alpha: torch.Tensor
    beta: torch.Tensor

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self.use_alpha_beta = self.param.use_alpha_beta
        if self.use_alpha_beta:
            channels = self.mean.shape[0]
            self.add_blob("alpha", (channels,), value=1.0)
            self.add_blob("beta", (channels,), value=0.0)

    def _check_param(self, p, layer_param) -> None:
        """The fork takes use_alpha_beta and leaves ParamSpecs as written."""

    def complete_param(self, lp) -> None:
        """Nothing: the fork's LayerSetUp adds no ParamSpecs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._normalize(x)
        if not self.use_alpha_beta:
            return y
        alpha, beta = self.alpha, self.beta
        if self.uses_global_stats:  # Caffe returns before the alpha / beta diffs
            alpha, beta = alpha.detach(), beta.detach()
        view = (1, -1) + (1,) * (x.dim() - 2)
        return y * alpha.reshape(view) + beta.reshape(view)
