"""BN: the batch normalization + scale/shift layer of the PSPNet and SegNet Caffe forks."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..proto import caffe_pb2
from ..registry import register_layer
from ._functional.bn import stored_stats_batch_grad
from ._legacy import legacy_nchw
from ._transforms import refuse_stats_update
from .base import Between, CaffeLayer, Shape

BN = caffe_pb2.BNParameter
SEGNET_FIELDS = ("bn_mode", "scale_filler", "shift_filler")
PSPNET_FIELDS = ("slope_filler", "bias_filler", "momentum", "eps", "frozen", "engine")
SEGNET_EPS = 1e-9  # caffe-segnet's BNLayer hard-codes var_eps_


@register_layer("BN", fork="PSPNet, SegNet")
class BNLayer(CaffeLayer):
    """y = (x - mean) / sqrt(var + eps) * slope + bias per channel, over N, H, W. Caffe type
    ``BN``, ``bn_param``, in two fork dialects told apart by the fields set (their field
    numbers clash, so torchcaffe's proto holds SegNet's at relocated numbers).

    PSPNet (hszhao/PSPNet bn_layer.cpp; the default; slope_filler, bias_filler, momentum =
    0.9, eps = 1e-5, frozen = false, engine): blobs ``weight`` (slope), ``bias``, buffers
    ``mean``, ``variance`` (0, or 1 when frozen), all (1, C, 1, 1), as the published
    caffemodels store them. TRAIN: biased batch statistics, stored = (1 - momentum) * batch
    + momentum * stored. TEST or ``frozen``: stored statistics; ``frozen`` gives slope / bias
    no gradient. As Caffe, sets lr_mult = decay_mult = 0 on ParamSpecs 2, 3 (and 0, 1 when
    frozen). ``engine`` is ignored, as in the fork, whose factory never builds CuDNNBNLayer.
    Top: bottom's shape, one top.
    SegNet (alexgkendall/caffe-segnet bn_layer.cpp; any of bn_mode, scale_filler,
    shift_filler): blobs ``weight`` (scale), ``bias`` (shift), (1, C, 1, 1). LEARN, in either
    phase: batch statistics, var = E(x^2) - E(x)^2, eps = 1e-9; optional tops 1, 2 = batch
    mean and var (1, C, 1, 1), no gradient. INFERENCE: y = x * scale + shift (the statistics
    are folded into the blobs). Top: legacy 4-D shape.
    Fillers default to Caffe's constant 0. Bottom: 1 to 4 axes (legacy accessors).
    Differs from torch: stored statistics updated by momentum with the biased variance
    (PSPNet); PSPNet in TEST (not frozen) backpropagates the batch-statistics formula, as
    Caffe does (see _functional/bn.py).
    """

    param_field = "bn_param"
    tops = Between(1, 3)
    restrictions = (
        "SegNet dialect: scale / shift diffs are accumulated where Caffe "
        "overwrites them (shows with iter_size > 1 or shared params); Caffe keeps "
        "its setup-time N, C, H, W on reshape; bn_mode INFERENCE with 2 or 3 tops "
        "(Caffe leaves tops 1, 2 unwritten) is refused. A bn_param with none of "
        "SegNet's fields is read as PSPNet's, so a SegNet caffemodel (2 blobs) "
        "needs bn_mode or a filler set in the prototxt"
    )

    # param blobs, registered by add_blob
    weight: torch.Tensor
    bias: torch.Tensor
    mean: torch.Tensor
    variance: torch.Tensor

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self.dialect = self._pick_dialect(self.param)
        self.inference = self.dialect == "segnet" and self.param.bn_mode == BN.INFERENCE
        self._check_tops()
        _, channels, _, _ = legacy_nchw(self, self.bottom_shapes[0])
        if self.dialect == "segnet":
            self._segnet_blobs((1, channels, 1, 1))
        else:
            self._pspnet_blobs((1, channels, 1, 1))

    # -- setup ----------------------------------------------------------------------------
    def _pick_dialect(self, p: caffe_pb2.BNParameter) -> str:
        segnet = [f for f in SEGNET_FIELDS if p.HasField(f)]
        pspnet = [f for f in PSPNET_FIELDS if p.HasField(f)]
        if segnet and pspnet:
            raise self.error(
                "bn_param mixes SegNet fields with PSPNet fields",
                expected=f"only SegNet {SEGNET_FIELDS} or only PSPNet {PSPNET_FIELDS}",
                got=segnet + pspnet,
            )
        return "segnet" if segnet else "pspnet"

    def _check_tops(self) -> None:
        """Only SegNet's LEARN mode writes the extra tops (batch mean and variance)."""
        max_tops = 3 if self.dialect == "segnet" and not self.inference else 1
        if self.num_tops > max_tops:
            mode = "SegNet bn_mode INFERENCE" if self.inference else "PSPNet dialect"
            raise self.error(
                f"too many top blobs for the {mode} (extra tops are the batch "
                "mean and variance of SegNet's LEARN mode)",
                expected=f"{max_tops} top",
                got=self.num_tops,
            )

    def _segnet_blobs(self, shape: Shape) -> None:
        p = self.param
        self.add_blob("weight", shape, filler=p.scale_filler)
        self.add_blob("bias", shape, filler=p.shift_filler)

    def _pspnet_blobs(self, shape: Shape) -> None:
        p = self.param
        self.frozen, self.momentum, self.eps = p.frozen, p.momentum, p.eps
        self.add_blob("weight", shape, filler=p.slope_filler)
        self.add_blob("bias", shape, filler=p.bias_filler)
        self.add_blob("mean", shape, learnable=False)
        self.add_blob("variance", shape, learnable=False, value=1.0 if self.frozen else 0.0)
        specs = self.layer_param.param
        while len(specs) < 4:  # Caffe rewrites the layer's ParamSpecs in LayerSetUp
            specs.add()
        for i in (0, 1, 2, 3) if self.frozen else (2, 3):
            specs[i].lr_mult = specs[i].decay_mult = 0.0

    # -- shapes and forward ---------------------------------------------------------------
    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        nchw = self._check_bottom(bottom_shapes[0])
        if self.dialect == "pspnet":
            return [tuple(int(d) for d in bottom_shapes[0])]
        stats: list[Shape] = [(1, nchw[1], 1, 1)] * (self.num_tops - 1)
        return [nchw, *stats]

    def _check_bottom(self, shape: Sequence[int]) -> tuple[int, int, int, int]:
        nchw = legacy_nchw(self, shape)
        if nchw[1] != self.weight.shape[1]:
            raise self.error(
                "bottom channels (axis 1) differ from the BN blobs",
                expected=f"shape (N, {self.weight.shape[1]}, ...)",
                got=list(shape),
            )
        return nchw

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        n, c, h, w = self._check_bottom(x.shape)
        rows = x.reshape(n, c, h * w)
        if self.dialect == "segnet":
            return self._segnet(rows, (n, c, h, w))
        return self._pspnet(rows).reshape(x.shape)

    def _pspnet(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (N, C, H*W) -> normalized, scaled and shifted rows."""
        c = rows.shape[1]
        slope, bias = self.weight.reshape(c, 1), self.bias.reshape(c, 1)
        if self.frozen:  # Caffe: bottom diff = g * slope * inv_std, no slope / bias diffs
            inv_std = (self.variance.reshape(c, 1) + self.eps).rsqrt()
            x_hat = (rows - self.mean.reshape(c, 1)) * inv_std
            return x_hat * slope.detach() + bias.detach()
        if not self.training:
            inv_std = (self.variance.reshape(c, 1) + self.eps).rsqrt()
            x_hat = stored_stats_batch_grad(rows, self.mean.reshape(c, 1), inv_std)
            return x_hat * slope + bias
        refuse_stats_update(self)
        mean = rows.mean(dim=(0, 2), keepdim=True)
        centered = rows - mean
        var = (centered * centered).mean(dim=(0, 2), keepdim=True)
        self._update_stats(mean.detach(), var.detach())
        return centered * (var + self.eps).rsqrt() * slope + bias

    def _segnet(
        self, rows: torch.Tensor, nchw: tuple[int, int, int, int]
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """rows (N, C, H*W) -> the 4-D top [, batch mean, batch variance]."""
        c = rows.shape[1]
        scale, shift = self.weight.reshape(c, 1), self.bias.reshape(c, 1)
        if self.inference:
            return (rows * scale + shift).reshape(nchw)
        mean = rows.mean(dim=2, keepdim=True).mean(dim=0, keepdim=True)
        var = (rows * rows).mean(dim=2, keepdim=True).mean(dim=0, keepdim=True) - mean * mean
        top = ((rows - mean) / torch.sqrt(var + SEGNET_EPS) * scale + shift).reshape(nchw)
        if self.num_tops == 1:
            return top
        stats = (mean.detach().reshape(1, c, 1, 1), var.detach().reshape(1, c, 1, 1))
        return (top,) + stats[: self.num_tops - 1]

    @torch.no_grad()
    def _update_stats(self, mean: torch.Tensor, var: torch.Tensor) -> None:
        """Caffe's caffe_cpu_axpby(1 - momentum, batch, momentum, stored)."""
        m = self.momentum
        for stored, batch in ((self.mean, mean), (self.variance, var)):
            stored.mul_(m).add_(batch.reshape(stored.shape).to(stored.dtype), alpha=1 - m)
