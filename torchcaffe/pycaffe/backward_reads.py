"""Which layers' Caffe Backward reads their bottom blobs' data as it is at backward time.

Caffe's Net::Backward hands each layer the live blobs, so data a pycaffe script writes between
``forward()`` and ``backward()`` changes the diffs of layers whose Backward_cpu reads
``bottom[i]->cpu_data()``: InnerProduct and Convolution (the weight diff), ReLU, AbsVal, BNLL,
Log and Clip (the local slope), PReLU and Scale (both), Embed and BatchReindex (the indices
that route the diff), ELU, Power and LRN ACROSS_CHANNELS, which read their top too, and LRN
WITHIN_CHANNEL (see ``top_data_rule``). Other layers read what their forward left behind, and
an edit to a bottom leaves their diffs as the forward made them: Sigmoid, TanH, Exp, Swish,
Softmax and MVN read top data (see ``top_data_rule``); Pooling MAX and Eltwise MAX a
forward-time argmax; Dropout its mask; BatchNorm and the losses with an internal buffer
(SoftmaxWithLoss, EuclideanLoss, SigmoidCrossEntropyLoss, ContrastiveLoss) their buffers.
Python layers see the blobs their own forward was given. Layers whose diffs do not depend on
data (Split, Concat, Reshape, Eltwise SUM, Pooling AVE...) give the same answer either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ..net.program import LayerStep
from ..ops._functional.mvn import aliased_axpby
from ..ops._legacy import legacy_nchw
from ..ops.base import CaffeLayer
from ..ops.lrn import LP, LRNLayer, channel_window_sum, neg_power
from ..ops.mvn import MVNLayer
from ..ops.neuron import ELULayer, ExpLayer, PowerLayer, SwishLayer
from ..ops.softmax import SoftmaxLayer

READS_BOTTOM_DATA = frozenset(
    {
        "InnerProduct",
        "Convolution",
        "Deconvolution",
        "DepthwiseConvolution",
        "ConvolutionDepthwise",
        "ReLU",
        "PReLU",
        "AbsVal",
        "BNLL",
        "Log",
        "Clip",
        "Scale",
        "Reduction",
        "Embed",
        "BatchReindex",
        "InfogainLoss",
        "MultinomialLogisticLoss",
    }
)

# In place, these read a copy of the bottom their forward kept (PReLU's bottom_memory_,
# Scale's temp_), not the blob.
COPY_BOTTOM_IN_PLACE = frozenset({"PReLU", "Scale"})


def reads_bottom_data(step: LayerStep) -> bool:
    """True when Caffe's Backward for ``step`` reads its bottoms' current data."""
    if step.type not in READS_BOTTOM_DATA:
        return False
    in_place = any(b in step.tops for b in step.bottoms)
    return not (in_place and step.type in COPY_BOTTOM_IN_PLACE)


def slope_kept_when_overwritten(step: LayerStep, module: CaffeLayer, rewritten: bool) -> bool:
    """Does ``step``'s Caffe Backward give the same diffs when its bottom blob holds what
    ``step`` itself overwrote it with in place? A ReLU with a slope >= 0 does (its output has
    its input's sign), so its forward record serves, unless a later in-place layer rewrites
    the blob with another sign pattern (``rewritten``: a Scale or BatchNorm after it), whose
    values Caffe's mask then reads. BNLL, Log and Clip do not: in place, Caffe takes their
    slope at the data."""
    if step.type != "ReLU" or rewritten:
        return False
    return module.param.negative_slope >= 0


def relu_in_place(step: LayerStep) -> bool:
    """An in-place ReLU: where a later in-place layer rewrites its blob, Caffe's Backward
    mask (bottom_data > 0) is that layer's output's sign, not the ReLU's."""
    return step.type == "ReLU" and step.in_place[0]


def _sigmoid_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    # Caffe: top_diff * sigmoid_x * (1. - sigmoid_x); the double literal makes it double math
    y64 = y.double()
    return (dy.double() * y64 * (1.0 - y64)).to(dy.dtype)


def _tanh_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    # Caffe: top_diff * (1 - tanhx * tanhx), in the blob's type
    return dy * (1 - y * y)


# Layers whose Caffe Backward reads only top data and top diff: after a forward the face
# computes their bottom diff from the top blob as it is now (a script may have written it).
TOP_DATA_BACKWARD: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "Sigmoid": _sigmoid_backward,
    "TanH": _tanh_backward,
}


def _mvn_backward(layer: MVNLayer, x: torch.Tensor) -> Callable[..., torch.Tensor]:
    """MVNLayer::Backward_cpu (normalize_variance) from its top blob as it is now; std + eps,
    Caffe's variance_ buffer, is its forward's, from ``x``, the bottom that forward read."""
    _, c, h, w = legacy_nchw(layer, x.shape)
    dim = c * h * w if layer.across_channels else h * w
    rows = x.detach().reshape(-1, dim)
    centered = rows - rows.mean(dim=1, keepdim=True)
    denom = torch.sqrt((centered * centered).mean(dim=1, keepdim=True)) + layer.eps

    def rule(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        y, dy = y.reshape(-1, dim), dy.reshape(-1, dim)
        if layer.in_place:  # the diff it writes is the one it reads (CaffeMVNInPlace)
            d = y * (y * dy).sum(dim=1, keepdim=True)
            d = d + d.sum(dim=1, keepdim=True)
            return aliased_axpby(d, dim) / denom.to(y.dtype)
        sums = y * (y * dy).sum(dim=1, keepdim=True) + dy.sum(dim=1, keepdim=True)
        return (dy - sums / dim) / denom.to(y.dtype)

    return rule


def _exp_backward(layer: ExpLayer) -> Callable[..., torch.Tensor]:
    """ExpLayer::Backward_cpu: top_diff * top, times inner_scale unless it is 1."""
    scale = layer.inner_scale
    return lambda y, dy: dy * y if scale == 1 else dy * y * scale


def _swish_backward(layer: SwishLayer, x: torch.Tensor) -> Callable[..., torch.Tensor]:
    """SwishLayer::Backward_cpu: top_diff * (beta * top + s * (1. - beta * top)), s its
    forward's sigmoid(beta * x) (sigmoid_output_); the double literal makes it double math."""
    beta = layer.param.beta
    s = torch.sigmoid(x.detach() * beta).double()

    def rule(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        by = (y * beta).double()
        return (dy.double() * (by + s.view(y.shape) * (1.0 - by))).to(dy.dtype)

    return rule


def _softmax_backward(layer: SoftmaxLayer) -> Callable[..., torch.Tensor]:
    """SoftmaxLayer::Backward_cpu: (top_diff - sum over the axis of top_diff * top) * top."""
    axis = layer.axis
    return lambda y, dy: (dy - (dy * y).sum(dim=axis, keepdim=True)) * y


def _lrn_backward(
    layer: LRNLayer, x: torch.Tensor, x_now: torch.Tensor
) -> Callable[..., torch.Tensor]:
    """LRNLayer::Backward_cpu from its blobs as they are now (``x_now`` the bottom's data),
    with what its forward kept computed from ``x``, the bottom that forward read.

    ACROSS_CHANNELS (CrossChannelBackward_cpu): scale^-beta * top_diff - 2 alpha beta / n *
    bottom * (sum over the n channels around of top_diff * top / scale), bottom and top live,
    scale_ its forward's. WITHIN_CHANNEL runs its sublayers' Backward: the Eltwise product and
    the squaring Power read the bottom (their Split's tops share its data), the inner Power
    its forward's blobs, and no one the top: p * top_diff + 2 * bottom * (AVE pooling's
    backward of bottom * top_diff * p'), p = (1 + alpha * window mean of x^2)^-beta."""
    n, alpha, beta = layer.local_size, layer.alpha, layer.beta
    x = x.detach()
    if layer.norm_region == LP.ACROSS_CHANNELS:
        scale = channel_window_sum(x * x, n).mul_(alpha / n).add_(layer.k)
        ratio, inverse = 2.0 * alpha * beta / n, neg_power(scale, beta)

        def across(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
            window = channel_window_sum(dy * y / scale, n)
            return inverse * dy - ratio * x_now * window

        return across
    pad = (n - 1) // 2
    pool = F.avg_pool2d(x * x, n, 1, pad, ceil_mode=True, count_include_pad=True)
    p = neg_power(1 + alpha * pool, beta)
    slope = p * (-beta * alpha) / (1 + alpha * pool)  # the inner Power's diff_scale * top / base

    def within(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        squares = torch.zeros_like(x, requires_grad=True)
        with torch.enable_grad():
            window = F.avg_pool2d(squares, n, 1, pad, ceil_mode=True, count_include_pad=True)
        (d_sq,) = torch.autograd.grad(window, squares, x_now * dy * slope)
        return p * dy + 2 * x_now * d_sq

    return within


def keeps_forward_bottom(module: CaffeLayer) -> bool:
    """Does ``top_data_rule`` for this layer recompute what Caffe's forward kept (MVN's
    variance_, Swish's sigmoid_output_, LRN's scale_) from the bottom that forward read? A
    script may overwrite that blob before backward(), so the face keeps a copy."""
    if isinstance(module, MVNLayer):
        return bool(module.normalize_variance)
    return isinstance(module, (SwishLayer, LRNLayer))


def reads_top_data(step: LayerStep, module: CaffeLayer) -> bool:
    """Does Caffe's Backward for ``step`` read its top blob's data (and what its forward kept),
    but not its bottoms'?"""
    if isinstance(module, LRNLayer):  # WITHIN_CHANNEL reads its bottom only (top_data_rule)
        return module.norm_region == LP.ACROSS_CHANNELS
    if isinstance(module, MVNLayer):
        return bool(module.normalize_variance)
    if isinstance(module, PowerLayer):  # its slope is data-free when power is 1 or 0
        return module.power != 1 and module.power * module.scale != 0
    kinds = (ExpLayer, SwishLayer, ELULayer, SoftmaxLayer)
    return isinstance(module, kinds) or step.type in TOP_DATA_BACKWARD


def has_top_data_rule(step: LayerStep, module: CaffeLayer) -> bool:
    """Does ``top_data_rule`` compute ``step``'s Backward (from its blobs as they are now)
    where its top was rewritten: a layer that ``reads_top_data``, and every LRN (whose
    WITHIN_CHANNEL form reads its bottom now)? A path that computes the Backward otherwise
    rounds it otherwise."""
    return isinstance(module, LRNLayer) or reads_top_data(step, module)


def top_data_rule(
    step: LayerStep,
    module: CaffeLayer,
    forward_bottoms: Sequence[torch.Tensor],
    bottom_now: Callable[[], torch.Tensor],
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """``step``'s Caffe Backward as a function of its top blob now and its top diff, when
    ``reads_top_data`` or for an LRN; ``forward_bottoms``: what its forward read;
    ``bottom_now``: its bottom blob's data now (ELU, Power and LRN read it too)."""
    if not has_top_data_rule(step, module):
        return None
    if isinstance(module, LRNLayer):
        return _lrn_backward(module, forward_bottoms[0], bottom_now())
    if isinstance(module, (ELULayer, PowerLayer)):  # their slope reads bottom and top
        x, layer = bottom_now(), module
        return lambda y, dy: dy * layer.caffe_slope_at(x.view(y.shape), y)
    if isinstance(module, MVNLayer):
        return _mvn_backward(module, forward_bottoms[0])
    if isinstance(module, ExpLayer):
        return _exp_backward(module)
    if isinstance(module, SwishLayer):
        return _swish_backward(module, forward_bottoms[0])
    if isinstance(module, SoftmaxLayer):
        return _softmax_backward(module)
    return TOP_DATA_BACKWARD[step.type]
