"""Passes for runs that autograd records (training, or any forward with grad enabled).

``fuse_batchnorm_scale_for_training``: a BatchNorm (batch or global statistics) and the
per-channel Scale that alone reads its top run as one ``F.batch_norm`` with the Scale's weight
and bias,
so autograd keeps one input per pair instead of two intermediate tensors, and the kernel does
one pass. The BatchNorm's running statistics are updated exactly as the unfused layer does
(the kernel's saved batch mean and unbiased variance feed Caffe's update). Legal when the
BatchNorm's own top is not observable and neither step has a loss weight or stops a gradient.

``bypass_splits_for_training``: the readers of an unobserved Split's tops read its bottom
instead (Caffe's Split tops share its data too). Autograd then sums their gradients in place in
one buffer, as for a tensor a torch model reads twice, instead of one view node and one
out-of-place add per extra top.

``inplace_relu_for_training``: an in-place ReLU overwrites its bottom when the producer's
backward does not read its own output (so no saved tensor changes under autograd; were one
to, autograd's version check would raise rather than compute a wrong gradient).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from ...ops.base import CaffeLayer
from ...ops.eltwise import EltwiseLayer, EltwiseOp
from ..program import LayerStep
from .inplace import rewrite_relus_in_place
from .program import OptimizedProgram, readers_of, step_kind

FUSE_PASS = "fuse_batchnorm_scale_for_training"
SPLIT_PASS = "bypass_splits_for_training"
RELU_PASS = "inplace_relu_for_training"
# Producers whose backward reads their inputs (or nothing), never their output.
OUTPUT_FREE_BACKWARD = frozenset(
    {"Convolution", "Deconvolution", "InnerProduct", "BatchNorm", "Scale", "Bias"}
)


class TrainingBatchNormScale:
    """BatchNorm (batch statistics) + Scale [+ its bias] in one ``F.batch_norm``."""

    def __init__(self, bn: Any, scale: Any) -> None:
        self.bn = bn
        self.scale = scale
        self.bias_term = bool(scale.param.bias_term)  # read once: this runs per forward

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        bn, scale = self.bn, self.scale
        bias = scale.bias if self.bias_term else None
        if bn.uses_global_stats:  # frozen statistics (fine-tuning a deploy-style net)
            mean, var = bn.global_stats()
            if mean.dtype != x.dtype:
                mean, var = mean.to(x.dtype), var.to(x.dtype)
            return F.batch_norm(x, mean, var, scale.weight, bias, eps=bn.eps)
        if x.numel() // x.shape[1] <= 1:
            return scale(bn(x))  # one value per channel: the layer's own arithmetic
        batch_mean = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
        batch_var = torch.zeros_like(batch_mean)
        y = F.batch_norm(
            x, batch_mean, batch_var, scale.weight, bias, training=True, momentum=1.0, eps=bn.eps
        )
        bn._update_stats(batch_mean, batch_var)
        return y


def _pair_ok(program: OptimizedProgram, i: int, observable: frozenset[str]) -> int | None:
    """The index of the Scale fused with BatchNorm step ``i``, or None."""
    steps = program.steps
    step = steps[i]
    if step.type != "BatchNorm" or not isinstance(program.runners[step.key], CaffeLayer):
        return None
    bn: Any = program.runners[step.key]
    if len(step.bottoms) != 1 or len(step.tops) != 1 or any(step.loss_weights):
        return None
    readers = readers_of(steps, i, step.tops[0])
    if len(readers) != 1:
        return None
    nxt = steps[readers[0]]
    if nxt.type != "Scale" or not isinstance(program.runners[nxt.key], CaffeLayer):
        return None
    scale: Any = program.runners[nxt.key]
    if not scale.has_scale_blob:
        return None
    if len(nxt.bottoms) != 1 or len(nxt.tops) != 1 or any(nxt.loss_weights):
        return None
    channels = int(bn.mean.shape[0])
    if scale.param.axis != 1 or tuple(scale.weight.shape) != (channels,):
        return None
    if not all(step.propagate_down) or not all(nxt.propagate_down):
        return None
    if nxt.tops[0] != step.tops[0] and step.tops[0] in observable:
        return None
    return readers[0]


def fuse_batchnorm_scale_for_training(
    program: OptimizedProgram, observable: frozenset[str]
) -> OptimizedProgram:
    steps = program.steps
    removed: set[int] = set()
    replaced: dict[int, LayerStep] = {}
    runners: dict[str, TrainingBatchNormScale] = {}
    for i, step in enumerate(steps):
        if i in removed:
            continue
        j = _pair_ok(program, i, observable)
        if j is None:
            continue
        scale_step = steps[j]
        key = f"{step.key}+{scale_step.key}+fused"
        runners[key] = TrainingBatchNormScale(
            program.runners[step.key], program.runners[scale_step.key]
        )
        replaced[i] = dataclasses.replace(
            step, type="BatchNorm+Scale", key=key, tops=scale_step.tops
        )
        removed.add(j)
    new_steps = [replaced.get(i, s) for i, s in enumerate(steps) if i not in removed]
    return program.rewritten(FUSE_PASS, new_steps, runners, len(replaced))


def _split_ok(step: LayerStep, observable: frozenset[str]) -> bool:
    return (
        step.type == "Split"
        and len(step.bottoms) == 1
        and all(step.propagate_down)
        and not any(step.loss_weights)
        and not observable.intersection(step.tops)
    )


def bypass_splits_for_training(
    program: OptimizedProgram, observable: frozenset[str]
) -> OptimizedProgram:
    steps = list(program.steps)
    removed: set[int] = set()
    for i, step in enumerate(steps):
        if not _split_ok(step, observable):
            continue
        source = step.bottoms[0]
        readers = {top: readers_of(tuple(steps), i, top) for top in step.tops}
        last = max((j for js in readers.values() for j in js), default=i)
        if any(source in steps[k].tops for k in range(i + 1, last + 1)):
            continue  # the bottom is rewritten before a reader would read it
        for top, js in readers.items():
            for j in js:
                bottoms = tuple(source if b == top else b for b in steps[j].bottoms)
                steps[j] = dataclasses.replace(steps[j], bottoms=bottoms)
        removed.add(i)
    new_steps = [s for i, s in enumerate(steps) if i not in removed]
    return program.rewritten(SPLIT_PASS, new_steps, {}, len(removed))


def _backward_reads_no_output(program: OptimizedProgram, step: LayerStep) -> bool:
    """Whether ``step``'s backward leaves its top alone: OUTPUT_FREE_BACKWARD, and Eltwise but
    a PROD with Caffe's unstable gradient (top_diff * top / bottom reads the top)."""
    runner = program.runners[step.key]
    if step.type == "Eltwise" and isinstance(runner, EltwiseLayer):
        return runner.operation != EltwiseOp.PROD or runner.stable_prod_grad
    return step_kind(step) in OUTPUT_FREE_BACKWARD


def inplace_relu_for_training(
    program: OptimizedProgram, observable: frozenset[str]
) -> OptimizedProgram:
    return rewrite_relus_in_place(
        program, lambda step: _backward_reads_no_output(program, step), RELU_PASS
    )
