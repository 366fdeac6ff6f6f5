"""inplace_relu: a ReLU that the prototxt writes in place runs as ``relu_`` (inference only).

Legal when the value it overwrites is a fresh tensor no one else holds: its producer computes
a new tensor (not a view such as Split's tops or a user's input) and this ReLU is its only
reader, so no other blob aliases the storage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..program import LayerStep
from .program import OptimizedProgram, bottom_producers, readers_of, step_kind

PASS_NAME = "inplace_relu"
# Types whose forward returns a newly computed tensor (never a view of a bottom).
FRESH_PRODUCERS = frozenset(
    {"Convolution", "Deconvolution", "InnerProduct", "BatchNorm", "Scale", "Bias", "Eltwise"}
)


class InplaceReLU:
    """Caffe's ReLU (negative_slope) overwriting its bottom."""

    __slots__ = ("negative_slope",)

    def __init__(self, module: Any) -> None:
        self.negative_slope = module.param.negative_slope

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.negative_slope:
            return F.leaky_relu_(x, self.negative_slope)
        return torch.relu_(x)


def inplace_relu(program: OptimizedProgram, observable: frozenset[str]) -> OptimizedProgram:
    return rewrite_relus_in_place(
        program, lambda step: step_kind(step) in FRESH_PRODUCERS, PASS_NAME
    )


def rewrite_relus_in_place(
    program: OptimizedProgram, producer_ok: Callable[[LayerStep], bool], pass_name: str
) -> OptimizedProgram:
    """Every in-place ReLU whose bottom a step passing ``producer_ok`` wrote fresh, for it
    alone."""
    steps = program.steps
    producers = bottom_producers(steps)
    new_steps, runners, count = list(steps), {}, 0
    for i, step in enumerate(steps):
        if step.type != "ReLU" or step.bottoms != step.tops or len(step.bottoms) != 1:
            continue
        if getattr(program.runners[step.key], "in_place_slope", False):
            continue  # a negative slope: its own Function takes Caffe's slope at the output
        blob = step.bottoms[0]
        j = producers[i][0]
        if j is None or not producer_ok(steps[j]):
            continue
        if readers_of(steps, j, blob) != [i]:
            continue
        key = f"{step.key}+inplace"
        runners[key] = InplaceReLU(program.runners[step.key])
        new_steps[i] = dataclasses.replace(step, key=key, type="ReLU+inplace")
        count += 1
    return program.rewritten(pass_name, new_steps, runners, count)
