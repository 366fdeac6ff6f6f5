"""fuse_relu_into_producer: a ReLU runs inside the Convolution or InnerProduct before it
(folded or not), as OpenCV dnn's fuseLayers attaches an activation to its convolution
(inference only).

Legal when, as for a fold, nobody else sees the value the ReLU replaces: the ReLU is the only
reader of the producer's top, and that top is either overwritten in place (Caffe's usual
``conv -> relu`` on one name) or not observable. The merged step saves a step of the walk.
A leaky ReLU runs in oneDNN's epilogue on the CPU, saving a pass over the top too; a plain
one runs in place on the producer's fresh top, as ``inplace_relu`` would, since oneDNN's
relu turns NaN into 0 (``ops.fused_relu``), except in a run whose values are all finite: a
plain ReLU after only layers that make no NaN from finite values (``FINITE_PRESERVING``) runs in
oneDNN's epilogue when ``TorchNet`` finds the run's inputs and the params finite
(``passes/finite.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ...ops import fused_relu
from .finite import finite_before
from .program import (
    OptimizedProgram,
    StepMerges,
    bottom_producers,
    readers_of,
    step_kind,
)

PASS_NAME = "fuse_relu_into_producer"
PRODUCERS = ("Convolution", "InnerProduct")  # alone or with a chain folded in


class ProducerWithReLU:
    """Runs a producer's step (a layer or a fold that has ``top_with_relu``) with the ReLU
    after it fused in: in oneDNN's epilogue where ``finite_epilogue`` and the run is finite
    (``fused_relu.FINITE_RELU``)."""

    __slots__ = ("runner", "negative_slope", "finite_epilogue")

    def __init__(self, runner: Any, negative_slope: float, finite_epilogue: bool = False) -> None:
        self.runner = runner
        self.negative_slope = negative_slope
        self.finite_epilogue = finite_epilogue and negative_slope == 0

    @property
    def producer(self) -> Any:
        """The layer that computes the top (the layout pass reads its geometry)."""
        return getattr(self.runner, "producer", None) or self.runner

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        slope: fused_relu.Slope = self.negative_slope
        # the flag is read only outside a trace: a compiled graph guards what it reads
        if not torch.compiler.is_compiling() and self.finite_epilogue:
            slope = fused_relu.slope_for_run(slope, True)
        return self.runner.top_with_relu(x, slope)


def fuse_relu_into_producer(
    program: OptimizedProgram, observable: frozenset[str]
) -> OptimizedProgram:
    steps = program.steps
    merges = StepMerges(program)
    finite = finite_before(program)
    producers = bottom_producers(steps)
    in_epilogue = 0
    for i, step in enumerate(steps):
        if step.type != "ReLU" or len(step.bottoms) != 1 or len(step.tops) != 1:
            continue
        blob = step.bottoms[0]
        j = producers[i][0]
        if j is None:
            continue
        producer = steps[j]
        runner = program.runners[producer.key]
        if step_kind(producer) not in PRODUCERS or not hasattr(runner, "top_with_relu"):
            continue
        if len(producer.bottoms) != 1 or producer.tops != (blob,):
            continue
        if readers_of(steps, j, blob) != [i]:
            continue
        if step.tops != step.bottoms and blob in observable:
            continue  # the value before the ReLU is asked for
        relu: Any = program.runners[step.key]
        slope = float(relu.param.negative_slope)
        fused = ProducerWithReLU(runner, slope, finite[j])
        in_epilogue += fused.finite_epilogue
        merges.merge(j, [(i, step)], fused, "relu", step.tops)
    result = merges.result(PASS_NAME)
    return dataclasses.replace(result, finite_steps=result.finite_steps + in_epilogue)
