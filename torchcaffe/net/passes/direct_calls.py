"""direct_calls: off the CPU, a 2-D Convolution or an InnerProduct (folded or not, with the
ReLU fused after it) and a MAX or AVE Pooling run as one call into torch, their geometry
worked out once; in forwards autograd records (``direct_calls_for_training``) too, and the
Convolutions with their frozen BatchNorm.

A GPU's eager run is bound by the host's work per layer, not by its kernels: on an H100,
GoogLeNet at batch 1 took 6.2 ms where the hand-written model took 5.1 ms, with the same
kernels. Through the layer, a convolution walks the fused ReLU's wrapper, ``top_with_relu``,
``compute`` (its opaque-op, n-d and extra-pad checks) and ``conv2d`` (the CPU's packed and
pointwise forms) before ``F.conv2d``; a pooling computes Caffe's output size and the torch
flags that give it on every call. Here the convolution's geometry is read once and a bottom
large enough to need no extra pad (``spec_extra_pad``) goes straight to ``F.conv2d``; a
pooling keeps, per bottom shape, the kernel, stride, pad and ceil flag its layer would pass
to torch (``PoolingLayer.torch_pool_args``). Other bottoms, and a trace by torch.compile
(``traced_runner``), take the layer. The kernels are those the layer launches: the
convolution's ReLU in place, MAX's floor at -FLT_MAX (``nan_to_num``) before the pooling.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ...ops import fused_relu
from ...ops.convolution import ConvolutionLayer
from ...ops.inner_product import InnerProductLayer
from ...ops.pooling import FLT_MAX, PoolingLayer, torch_max_pool
from ...proto import caffe_pb2
from ..program import LayerStep
from .folding import FoldedAffine
from .program import OptimizedProgram
from .relu_fusion import ProducerWithReLU
from .training import FrozenBatchNormFold

PASS_NAME = "direct_calls"
TRAINING_PASS_NAME = "direct_calls_for_training"
PP = caffe_pb2.PoolingParameter
PRODUCTS = ("Convolution", "InnerProduct")  # alone, with a ReLU, or with a chain folded in
MAX_SHAPES = 16  # pooling plans kept per layer: a net reshaped to many sizes starts over


class DirectConv2d:
    """A ConvolutionLayer over 2 spatial axes at axis 1, then the ReLU of ``slope`` if any,
    as ``F.conv2d`` (and ``relu_``); ``fallback`` (the step's runner) for a bottom that is
    not 4-D or that needs Caffe's extra pad."""

    __slots__ = ("layer", "slope", "conv_args", "min_hw", "fallback")

    def __init__(self, layer: ConvolutionLayer, slope: fused_relu.Slope, fallback: Any) -> None:
        self.layer = layer
        self.slope = slope
        stride, pad, dilation = layer.geom.torch_args()
        self.conv_args = (stride, pad, dilation, layer.group)
        extent = layer.geom.spec[5]
        # below these sizes C's division gives an output that floor rounding would not
        self.min_hw = (extent[0] - 2 * pad[0], extent[1] - 2 * pad[1])
        self.fallback = fallback

    @property
    def traced_runner(self) -> Any:
        """What torch.compile runs: the step's own runner (inductor picks its kernels)."""
        return self.fallback

    def takes(self, x: torch.Tensor) -> bool:
        """Is ``x`` 4-D and large enough to need no extra pad?"""
        shape = x.shape
        return len(shape) == 4 and shape[2] >= self.min_hw[0] and shape[3] >= self.min_hw[1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.takes(x):
            return self.fallback(x)
        layer = self.layer
        y = F.conv2d(x, layer.weight, layer.bias if layer.bias_term else None, *self.conv_args)
        return fused_relu.apply_(y, self.slope)


class DirectFoldedConv2d(DirectConv2d):
    """A Convolution with BatchNorm / Scale / Bias folded in (``FoldedAffine``, inference):
    its folded weights, cached on their sources, in one ``F.conv2d``; the fold's own run
    where those weights are not finite (on the CPU, ``folds_non_finite``)."""

    __slots__ = ("fold",)

    def __init__(self, fold: FoldedAffine, slope: fused_relu.Slope, fallback: Any) -> None:
        super().__init__(fold.producer, slope, fallback)
        self.fold = fold

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.takes(x):
            return self.fallback(x)
        fold = self.fold
        w, b = fold.folded_weights()
        if fold.folds_non_finite(w):
            return self.fallback(x)
        return fused_relu.apply_(F.conv2d(x, w, b, *self.conv_args), self.slope)


class DirectFrozenFold(DirectConv2d):
    """A Convolution with its frozen BatchNorm (+ Scale / Bias) in a forward autograd records
    (``FrozenBatchNormFold``), as the fold runs off the CPU: ``F.conv2d`` on the layer's
    weights, then one batch norm on the frozen statistics (``batch_norm_after``). The fold
    itself once the BatchNorm uses batch statistics."""

    __slots__ = ("fold", "bn")

    def __init__(self, fold: FrozenBatchNormFold) -> None:
        super().__init__(fold.producer, None, fold)
        self.fold = fold
        self.bn: Any = fold.bn

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        fold = self.fold
        if not self.takes(x) or not self.bn.uses_global_stats:
            return fold(x)
        layer = self.layer
        y = F.conv2d(x, layer.weight, layer.bias if layer.bias_term else None, *self.conv_args)
        return fold.batch_norm_after(y)


class DirectLinear:
    """An InnerProductLayer at axis 1, then the ReLU of ``slope`` if any, as ``F.linear``
    over the bottom flattened from axis 1 (and ``relu_``); ``fallback`` (the step's runner)
    for a bottom of another size, which the layer reports."""

    __slots__ = ("layer", "slope", "k", "fallback")

    def __init__(self, layer: InnerProductLayer, slope: fused_relu.Slope, fallback: Any) -> None:
        self.layer = layer
        self.slope = slope
        self.k = layer.k
        self.fallback = fallback

    @property
    def traced_runner(self) -> Any:
        return self.fallback

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2:
            return self.fallback(x)
        flat = x.flatten(1)
        if flat.shape[1] != self.k:
            return self.fallback(x)
        layer = self.layer
        weight = layer.weight.t() if layer.transpose else layer.weight
        y = F.linear(flat, weight, layer.bias if layer.param.bias_term else None)
        return fused_relu.apply_(y, self.slope)


class DirectPool2d:
    """A one-top MAX or AVE PoolingLayer as torch's pooling with the arguments the layer
    would pass it for this bottom shape, kept per shape; the layer where torch cannot express
    Caffe's windows. ``recorded``: the program is for forwards autograd records."""

    __slots__ = ("layer", "is_max", "recorded", "plans")

    def __init__(self, layer: PoolingLayer, recorded: bool) -> None:
        self.layer = layer
        self.is_max = layer.pool == PP.MAX
        self.recorded = recorded  # in a program for forwards autograd records
        self.plans: dict[torch.Size, tuple[Any, ...] | None] = {}

    @property
    def traced_runner(self) -> Any:
        return self.layer

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        try:
            plan = self.plans[x.shape]
        except KeyError:
            plan = self._plan(x)
        if plan is None:
            return self.layer(x)
        kernel, stride, pad, ceil = plan
        if not self.is_max:
            return F.avg_pool2d(x, kernel, stride, pad, ceil, True)  # count_include_pad
        if self.recorded:  # autograd, or a torch.func transform: Caffe's mask
            return torch_max_pool(x, kernel, stride, pad, ceil)
        # Caffe's MAX never picks NaN, nor a value at or below -FLT_MAX: the op
        # ``pooling._floor_at_flt_max`` picks outside autograd, without its checks
        floored = torch.nan_to_num(x, nan=-FLT_MAX, posinf=math.inf, neginf=-FLT_MAX)
        return torch.max_pool2d(floored, kernel, stride, pad, 1, ceil)

    def _plan(self, x: torch.Tensor) -> tuple[Any, ...] | None:
        if len(self.plans) >= MAX_SHAPES:
            self.plans.clear()
        plan = self.layer.torch_pool_args(tuple(x.shape))
        self.plans[x.shape] = plan
        return plan


def _direct_product(runner: Any) -> DirectConv2d | DirectLinear | None:
    """The direct form of a step that runs a ConvolutionLayer, an InnerProductLayer or an
    inference fold into a Convolution, with or without a fused ReLU; None for others (a
    subclass may compute otherwise), other layouts and axes."""
    inner, slope = runner, None
    if isinstance(runner, ProducerWithReLU):
        inner, slope = runner.runner, runner.negative_slope
    if type(inner) is FoldedAffine:
        if inner.producer_type == "Convolution" and _plain_conv(inner.producer):
            return DirectFoldedConv2d(inner, slope, runner)
        return None
    if _plain_conv(inner):
        return DirectConv2d(inner, slope, runner)
    if type(inner) is InnerProductLayer and inner.axis == 1:
        return DirectLinear(inner, slope, runner)
    return None


def _direct_pool(step: LayerStep, runner: Any, recorded: bool) -> DirectPool2d | None:
    """The direct form of a one-top MAX or AVE PoolingLayer's step."""
    if step.type == "Pooling" and type(runner) is PoolingLayer:
        if runner.num_tops == 1 and runner.pool in (PP.MAX, PP.AVE):
            return DirectPool2d(runner, recorded)
    return None


def _plain_conv(layer: Any) -> bool:
    """A ConvolutionLayer itself, of one bottom, over 2 spatial axes at axis 1."""
    return (
        type(layer) is ConvolutionLayer
        and len(layer.bottom_shapes) == 1
        and layer.geom.layout() == (1, 2)
    )


def direct_calls(program: OptimizedProgram, observable: frozenset[str]) -> OptimizedProgram:
    def direct(step: LayerStep, runner: Any) -> Any:
        if step.type.startswith(PRODUCTS):
            return _direct_product(runner)
        return _direct_pool(step, runner, recorded=False)

    return _with_direct_runners(program, PASS_NAME, direct)


def direct_calls_for_training(
    program: OptimizedProgram, observable: frozenset[str]
) -> OptimizedProgram:
    """For forwards that autograd records, off the CPU: Convolution, InnerProduct and Pooling
    steps, and Convolutions with their frozen BatchNorm, as direct calls, which autograd
    differentiates as it does the layers' ops there (a MAX pooling's backward is Caffe's mask,
    ``torch_max_pool``)."""

    def direct(step: LayerStep, runner: Any) -> Any:
        if type(runner) is FrozenBatchNormFold:
            if _plain_conv(runner.producer) and runner.bn is not None and runner.one_batch_norm:
                return DirectFrozenFold(runner)
            return None
        if step.type in ("Convolution", "InnerProduct"):
            return _direct_product(runner)
        return _direct_pool(step, runner, recorded=True)

    return _with_direct_runners(program, TRAINING_PASS_NAME, direct)


def _with_direct_runners(
    program: OptimizedProgram, name: str, direct: Callable[[LayerStep, Any], Any]
) -> OptimizedProgram:
    """``program`` with each step's runner replaced by ``direct(step, runner)`` where that
    is not None; the report counts them under ``name``."""
    new_steps = list(program.steps)
    runners: dict[str, Any] = {}
    for i, step in enumerate(program.steps):
        runner = direct(step, program.runners[step.key])
        if runner is not None:
            key = f"{step.key}+direct"
            runners[key] = runner
            new_steps[i] = dataclasses.replace(step, key=key)
    return program.rewritten(name, new_steps, runners, len(runners))
