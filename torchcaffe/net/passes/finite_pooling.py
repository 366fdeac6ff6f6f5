"""finite_pooling: a one-top MAX Pooling whose bottom is finite in a finite run pools without
its NaN check (inference, CPU).

Caffe's MAX pooling never selects NaN and starts each window at -FLT_MAX; torch's lets NaN
win. So on the CPU ``caffe_pool2d`` pools, then reads the top's minimum to see whether a
window met a NaN or had nothing above -FLT_MAX, and only then pools the floored bottom
again. That read is a pass over the top, after a convolution has left it cold: 1.03x on
GoogLeNet at batch 1 (13 MAX pools; in-net, 2 threads, median of 61 per-round ratios).
After only layers that keep finite values finite (``passes/finite.py``), in a run whose
inputs and params are finite, the bottom holds no NaN or infinity and the first pooling is
Caffe's. Poolings with a mask top are left as they are (``forward_finite`` gives the top).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ...ops import fused_relu
from ...proto import caffe_pb2
from .finite import finite_before
from .program import OptimizedProgram

PASS_NAME = "finite_pooling"
PP = caffe_pb2.PoolingParameter


class FiniteMaxPool:
    """Runs a MAX Pooling layer's ``forward_finite`` in a finite run, else the layer."""

    __slots__ = ("runner",)

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    @property
    def pool(self) -> int:
        """The layer's method (the layout pass reads it)."""
        return int(self.runner.pool)

    @property
    def traced_runner(self) -> Any:
        """What torch.compile runs: the layer (no flag is read in a trace)."""
        return self.runner

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling() and fused_relu.run_is_finite():
            return self.runner.forward_finite(x)
        return self.runner(x)


def finite_pooling(program: OptimizedProgram, observable: frozenset[str]) -> OptimizedProgram:
    finite = finite_before(program)
    new_steps = list(program.steps)
    runners: dict[str, Any] = {}
    for i, step in enumerate(program.steps):
        runner = program.runners[step.key]
        if step.type != "Pooling" or not finite[i] or len(step.tops) != 1:
            continue
        if getattr(runner, "pool", None) != PP.MAX or not hasattr(runner, "forward_finite"):
            continue
        key = f"{step.key}+finite"
        runners[key] = FiniteMaxPool(runner)
        new_steps[i] = dataclasses.replace(step, key=key)
    result = program.rewritten(PASS_NAME, new_steps, runners, len(runners))
    return dataclasses.replace(result, finite_steps=result.finite_steps + len(runners))
