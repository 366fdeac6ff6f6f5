"""A ReLU run as part of the Convolution or InnerProduct before it (``fuse_relu_into_producer``).

A leaky ReLU (negative_slope != 0) runs in oneDNN's epilogue, while each block of the top is
still in cache, as OpenCV dnn's fused convolution runs it: oneDNN computes x > 0 ? x : s * x,
Caffe's value for every input, NaN included. A plain ReLU does not: oneDNN's relu (and its
leaky_relu with slope 0, and hardtanh) turn NaN into 0 where Caffe's max(x, 0) + 0 * min(x, 0)
and torch.relu keep NaN, so a plain ReLU, and every path off oneDNN (a GPU, torch's own
kernels, a compiled graph), runs in place on the producer's fresh top instead.

A slope is ``None`` where no ReLU follows, else the ReLU's ``negative_slope``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

Slope = float | None


def onednn_call(op: Callable[..., torch.Tensor], slope: Slope, *args: Any) -> torch.Tensor:
    """``op(*args, attr, scalars, algorithm)``, one of oneDNN's pointwise ops
    (``mkldnn::_convolution_pointwise``, ``mkldnn::_linear_pointwise``), with a leaky ReLU
    as its epilogue, or a plain one applied after it."""
    if slope:
        return op(*args, "leaky_relu", [float(slope)], "")
    return apply_(op(*args, "none", [], ""), slope)


def apply_(y: torch.Tensor, slope: Slope) -> torch.Tensor:
    """This ReLU over ``y`` in place (``y`` is a fresh top no one else holds)."""
    if slope is None:
        return y
    if slope:
        return F.leaky_relu_(y, slope)
    return torch.relu_(y)
