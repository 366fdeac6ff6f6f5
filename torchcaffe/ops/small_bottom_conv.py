"""Inside a torch.compile graph on the CPU, a batch-1 dense convolution over a small bottom on
oneDNN instead of aten's im2col kernel.

For a batch-1 convolution whose bottom has at most ATEN_SMALL_BOTTOM elements (groups 1, not
both kernel sides above 3), aten picks its own im2col + GEMM kernel over oneDNN. That is
faster for the smallest products, and slower from about 5M multiply-adds. MobileNetV2 has
seven such convolutions (96 -> 576 at 14x14, 160 -> 960 and 320 -> 1280 at 7x7), 0.9-1.05 ms
of each batch-1 call in both our compiled net and the hand-written one.

Inductor lowers ``mkldnn::_convolution_pointwise`` over a plain, unfrozen weight as a C++
call, with no Python dispatch in between (our opaque ops cost ~40 us a call). Its lowering
makes the top channels_last; the top is handed on in the bottom's layout, so that the ops
after it run as they did (a channels_last top would send the next pointwise convolutions to
``opaque_conv``'s op, 0.4 ms more on MobileNetV2). Compiled alone, 2 threads, median of 300,
aten / this form, with the copy: 3.6M multiply-adds 0.88x, 7.2M 1.15x, 10.8M 1.26x, 35M 1.47x.
"""

from __future__ import annotations

import torch

from . import onednn_conv, onednn_linear
from .onednn_conv import Geometry

# aten's limit: a batch-1 bottom of at most this many elements goes to its im2col kernel
ATEN_SMALL_BOTTOM = 20480
# multiply-adds from which oneDNN is faster than aten's im2col kernel (see above)
MIN_MACS = 5 << 20


_CONV = onednn_conv.pointwise_op()


def wanted(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry: Geometry
) -> bool:
    """Whether a compiled graph should run this 2-D convolution here: one that aten would send
    to its im2col kernel (batch 1, groups 1, a bottom of at most ATEN_SMALL_BOTTOM elements,
    not both kernel sides above 3) with at least MIN_MACS multiply-adds, on CPU float32
    tensors (``onednn_linear.graph_can_take``: compiling, not exporting, params not frozen),
    static shapes, and nothing recorded by autograd (the op has no backward)."""
    stride, pad, dilation, groups = geometry
    if _CONV is None or groups != 1 or x.dim() != 4:
        return False
    tensors = [x, weight] if bias is None else [x, weight, bias]
    if not onednn_linear.graph_can_take(tensors):
        return False
    if not all(type(s) is int for s in (*x.shape, *weight.shape)):
        return False  # a symbolic size: the checks below would guard on it
    out_c, _, kh, kw = weight.shape
    if x.shape[0] != 1 or x.numel() > ATEN_SMALL_BOTTOM or (kh > 3 and kw > 3):
        return False  # aten takes oneDNN itself
    out_h, out_w = (
        (size + 2 * p - d * (k - 1) - 1) // step + 1
        for size, k, step, p, d in zip(x.shape[2:], (kh, kw), stride, pad, dilation)
    )
    if out_c * x.shape[1] * kh * kw * out_h * out_w < MIN_MACS:
        return False  # aten's kernel is faster
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def conv2d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry: Geometry
) -> torch.Tensor:
    """``F.conv2d(x, weight, bias, *geometry)`` on oneDNN, its top in the layout of ``x`` (the
    caller checked ``wanted``)."""
    assert _CONV is not None
    stride, pad, dilation, groups = geometry
    y = _CONV(x, weight, bias, list(pad), list(stride), list(dilation), groups, "none", [], "")
    if onednn_conv.is_channels_last(x):
        return y.contiguous(memory_format=torch.channels_last)
    return y.contiguous()
