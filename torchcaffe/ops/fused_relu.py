"""A ReLU run as part of the Convolution or InnerProduct before it (``fuse_relu_into_producer``).

A leaky ReLU (negative_slope != 0) runs in oneDNN's epilogue, while each block of the top is
still in cache, as OpenCV dnn's fused convolution runs it: oneDNN computes x > 0 ? x : s * x,
Caffe's value for every input, NaN included. A plain ReLU does not: oneDNN's relu (and its
leaky_relu with slope 0, and hardtanh) turn NaN into 0 where Caffe's max(x, 0) + 0 * min(x, 0)
and torch.relu keep NaN, so a plain ReLU, and every path off oneDNN (a GPU, torch's own
kernels, a compiled graph), runs in place on the producer's fresh top instead.

A slope is ``None`` where no ReLU follows, else the ReLU's ``negative_slope``.

NaN is the only value where oneDNN's relu and Caffe's differ, and a run whose inputs and params
are all finite, through layers that make no NaN from finite values (``finite_run``), has none
but through float32 overflow (past 3.4e38, where the order of a product's additions, which is
not Caffe's anyway, already decides between inf and NaN). There a plain ReLU's slope is
FINITE_RELU, and it runs in oneDNN's epilogue too. In-net against the ReLU after the product,
2 threads, median of per-round ratios (41-101 rounds at batch 1, 15-21 at batch 8), the checks
included (the input's sum, ~50 us at batch 1): MobileNetV2 1.03x-1.04x at batch 1, 1.06x-1.08x
at batch 8; ResNet-50 1.01x / 1.03x; GoogLeNet 1.00x-1.01x and CaffeNet 0.99x at batch 1.
Outputs bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F

Slope = float | None


class _FiniteReLU(float):
    """The slope of a plain ReLU over values known to be finite (see the module docstring)."""


FINITE_RELU: Slope = _FiniteReLU(0.0)

# Is the current run one whose values are all finite (but for overflow)? Set per run by
# ``finite_run``; cleared by a step that finds its derived weights are not.
_FINITE_RUN: ContextVar[bool] = ContextVar("torchcaffe_finite_run", default=False)


@contextmanager
def finite_run(finite: bool) -> Iterator[None]:
    """Within: ``run_is_finite()`` is ``finite`` (until ``taint_run``)."""
    token = _FINITE_RUN.set(finite)
    try:
        yield
    finally:
        _FINITE_RUN.reset(token)


def run_is_finite() -> bool:
    return _FINITE_RUN.get()


def taint_run() -> None:
    """The rest of the current run may meet NaN (a step's derived weights are not finite)."""
    _FINITE_RUN.set(False)


def slope_for_run(slope: Slope, finite_epilogue: bool) -> Slope:
    """The slope a fused ReLU takes in the current run: FINITE_RELU for a plain one that may
    run in oneDNN's epilogue (``finite_epilogue``) when the run is finite."""
    return FINITE_RELU if finite_epilogue and run_is_finite() else slope


def after_derived_weights(slope: Slope, weights_finite: bool) -> Slope:
    """``slope`` for a product over derived weights (a fold's): where they are not finite,
    NaN may follow, so the rest of the run is tainted and this ReLU leaves the epilogue."""
    if weights_finite:
        return slope
    taint_run()
    return 0.0 if slope is FINITE_RELU else slope


def onednn_call(op: Callable[..., torch.Tensor], slope: Slope, *args: Any) -> torch.Tensor:
    """``op(*args, attr, scalars, algorithm)``, one of oneDNN's pointwise ops
    (``mkldnn::_convolution_pointwise``, ``mkldnn::_linear_pointwise``), with a leaky ReLU
    as its epilogue, or a plain one applied after it (in the epilogue too for FINITE_RELU)."""
    if slope is FINITE_RELU:
        return op(*args, "relu", [], "")
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
