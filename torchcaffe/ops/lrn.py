"""LRN: local response normalization across channels or within each channel."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import limits
from ..proto import caffe_pb2
from ..registry import register_layer
from ._exporting import exporting
from ._launches import launch_bound
from ._narrow import computed_in_float32
from ._transforms import under_func_transform, with_jvp
from .base import CaffeLayer

LP = caffe_pb2.LRNParameter


@register_layer("LRN")
class LRNLayer(CaffeLayer):
    """Local response normalization. Caffe type ``LRN``, ``lrn_param``; (N, C, H, W) only.

    ACROSS_CHANNELS: y = x * (k + alpha / n * sum of x^2 over the n channels centred on c,
    zero beyond the edges)^-beta. WITHIN_CHANNEL (Caffe's composite of Power, AVE Pooling
    with pad (n - 1) / 2, Power and Eltwise): y = x * (1 + alpha / n^2 * sum of x^2 over the
    n x n window, zero beyond the borders)^-beta -- ``k`` is not used there.
    Differs from torch: WITHIN_CHANNEL has no torch equivalent; ACROSS computes what
    F.local_response_norm does, with a faster channel-window sum (see channel_window_sum).
    """

    param_field = "lrn_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if p.local_size % 2 != 1:
            raise self.error(
                "LRN only supports odd values for local_size", expected="odd", got=p.local_size
            )
        self.local_size, self.alpha, self.beta, self.k = p.local_size, p.alpha, p.beta, p.k
        self.norm_region = p.norm_region
        self._check(self.bottom_shapes[0])

    def _check(self, shape) -> None:
        if len(shape) != 4:
            raise self.error(
                "input must have 4 axes (num, channels, height, width)", expected=4, got=len(shape)
            )
        if self.norm_region == LP.ACROSS_CHANNELS:
            # Caffe's (and torch's) across-channel window pads the channel axis by local_size-1
            n, c, h, w = (int(d) for d in shape)
            padded = (max(n, 1), c + self.local_size - 1, h, w)
            problem = limits.shape_problem(padded)
            if problem:
                raise self.error(
                    f"local_size {self.local_size} needs a padded buffer of shape {padded}: "
                    f"{problem}",
                    expected=f"a local_size near the {c} channels",
                    got=self.local_size,
                )

    def output_shapes(self, bottom_shapes):
        self._check(tuple(bottom_shapes[0]))
        return [tuple(bottom_shapes[0])]

    # in float16 a square past 256 (CaffeNet's conv1 tops) and the window sum past 65504 are
    # inf, so the top would be 0 where Caffe's float one is not
    @computed_in_float32
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Shapes were checked by output_shapes (TorchNet.infer_shapes, once per input shape).
        n = self.local_size
        if self.norm_region == LP.ACROSS_CHANNELS:
            if (
                torch.is_grad_enabled()
                and x.requires_grad
                and x.is_cpu
                and not torch.jit.is_tracing()
                # torch.export inlines a Function's forward and keeps no backward: the out=
                # power then fails under autograd when the exported program runs
                and not exporting()
                and not under_func_transform()  # its forward writes out= and in place
            ):
                return with_jvp(AcrossChannelsLRN).apply(x, n, self.alpha, self.beta, self.k)
            sq = x * x
            scale = across_scale(sq, n, self.alpha, self.k)
            if (
                (torch.is_grad_enabled() and x.requires_grad)
                or torch.compiler.is_compiling()
                # traced: its graph may run backward, and the ONNX exporter has no out= ops
                or torch.jit.is_tracing()
                or under_func_transform()  # no out= op is batched
            ):
                return x * neg_power(scale, self.beta)
            # Nothing is saved for a backward: the power and the product reuse the square's
            # buffer (6 allocations of the bottom's size -> 2). Each fresh block can cost its
            # page faults: GoogLeNet's norm2 (1x192x56x56), 2 threads, 5.7 -> 2.5 ms where
            # the heap had just been trimmed, 0.62 -> 0.56 ms where not. Same values, bitwise.
            return neg_power(scale, self.beta, out=sq).mul_(x)
        window = F.avg_pool2d(x * x, n, 1, (n - 1) // 2, ceil_mode=True, count_include_pad=True)
        return x * neg_power(1 + self.alpha * window, self.beta)


class AcrossChannelsLRN(torch.autograd.Function):
    """ACROSS_CHANNELS LRN recorded by autograd on the CPU, with Caffe's own backward
    (``CrossChannelBackward``): bottom_diff = top_diff * scale^-beta - 2 * alpha * beta / n *
    x * (the channel-window sum of top_diff * top / scale). Autograd through the forward's
    in-place shifted adds recorded a copy and a fill of the bottom's size for each shift:
    GoogLeNet b8 forward+backward, 2 threads, spent ~100 of its ~405 ms a step in its two
    LRNs' copies, fills and products. The forward is the inference one; only the bottom is
    saved (the top may be written in place by a later layer), and the backward computes the
    scale again. Under torch.compile too: inductor fuses this backward's few ops where it
    traced autograd's derivative of the power (GoogLeNet compiled fwd+bwd b8: 463 / 471 ->
    437 / 430 ms, two alternated processes each)."""

    @staticmethod
    def forward(ctx, x, n, alpha, beta, k):  # type: ignore[override]
        sq = x * x
        scale = across_scale(sq, n, alpha, k)
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        ctx.lrn = (n, alpha, beta, k)
        if torch.compiler.is_compiling():
            # a fresh top: torch 2.11's dynamo traced a Function whose forward returns a
            # tensor written in place (out=, mul_) so that the compiled backward got no
            # gradient; the in-place form only saves eager allocations
            return x * neg_power(scale, beta)
        return neg_power(scale, beta, out=sq).mul_(x)

    @staticmethod
    def tangent(ctx, x_t, *_):
        """The forward's derivative (torch.autograd.forward_ad), the backward's transpose:
        t * scale^-beta - 2 alpha beta / n * top / scale * (the window sum of x * t)."""
        (x,) = ctx.saved_tensors
        n, alpha, beta, k = ctx.lrn
        scale = across_scale(x * x, n, alpha, k)
        power = neg_power(scale, beta)
        accum = channel_window_sum(x * x_t, n)
        return x_t * power - (2.0 * alpha * beta / n) * (x * power / scale) * accum

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_top):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        n, alpha, beta, k = ctx.lrn
        scale = across_scale(x * x, n, alpha, k)
        power = neg_power(scale, beta)  # scale^-beta: top = x * power
        ratio = grad_top * x
        ratio.mul_(power).div_(scale)  # top_diff * top / scale
        accum = channel_window_sum(ratio, n)
        grad = torch.mul(grad_top, power, out=ratio)
        return grad.addcmul_(accum, x, value=-2.0 * alpha * beta / n), None, None, None, None


def across_scale(sq: torch.Tensor, n: int, alpha: float, k: float) -> torch.Tensor:
    """ACROSS_CHANNELS' scale, k + alpha / n * (the window sum of the squares ``sq``), in a
    buffer of its own (``sq`` is left for the caller to reuse)."""
    return channel_window_sum(sq, n).mul_(alpha / n).add_(k)


def channel_window_sum(sq: torch.Tensor, n: int) -> torch.Tensor:
    """Sum of ``sq`` over the ``n`` channels centred on each channel, zero beyond the edges.

    On the CPU written as n - 1 shifted in-place adds rather than torch's avg_pool3d over a
    padded copy (4-5x faster there), and it keeps the input's memory format (channels_last
    stays so). Off the CPU, where each op is a kernel launch (and under autograd each
    in-place slice update adds copies to the backward), it is one sum pooling over the
    channel axis: GoogLeNet's batch-8 forward+backward on the meta device (which dispatches
    what a GPU would launch) 951 -> 747 aten ops, one LRN's alone 123 -> 21.
    """
    c = sq.shape[1]
    half = (n - 1) // 2
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        # inductor turns in-place slice updates into one kernel each; a sum of n shifted
        # slices of a zero-padded copy is pointwise, and it fuses into one. Traced for the
        # TorchScript ONNX exporter too, which writes avg_pool3d's divisor_override (and a
        # 4-D input to it) wrongly, and in-place slice adds as copies
        padded = F.pad(sq, (0, 0, 0, 0, half, half))
        return sum((padded[:, i : i + c] for i in range(1, n)), padded[:, 0:c])
    if launch_bound(sq):
        # a 4-D input is one unbatched (C, D, H, W) volume to avg_pool3d: the window runs
        # over our channel axis, and the top is a tensor of its own (in-place arithmetic on
        # a view would make autograd copy slices back)
        if n > c:  # the pooling refuses a window longer than the axis, even padded
            return F.avg_pool3d(
                F.pad(sq, (0, 0, 0, 0, half, half)), (n, 1, 1), 1, 0, False, True, 1
            )
        return F.avg_pool3d(sq, (n, 1, 1), 1, (half, 0, 0), divisor_override=1)
    total = sq.clone()
    for d in range(1, min(half, c - 1) + 1):
        total[:, d:] += sq[:, : c - d]
        total[:, : c - d] += sq[:, d:]
    return total


def neg_power(base: torch.Tensor, beta: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``base ** -beta`` (into ``out``, in place, when given). On the CPU Caffe's usual beta
    0.75 as rsqrt(b * sqrt(b)): within 2 ulp of pow and 5x faster there, where torch's pow
    with a fractional exponent is not vectorized; elsewhere one pow (one kernel, not three)."""
    if launch_bound(base):
        return torch.pow(base, -beta, out=out) if out is not None else base.pow(-beta)
    if out is not None:
        if beta == 0.75:
            return torch.sqrt(base, out=out).mul_(base).rsqrt_()
        return torch.pow(base, -beta, out=out)
    if beta == 0.75:
        return torch.rsqrt(base * torch.sqrt(base))
    return base.pow(-beta)
