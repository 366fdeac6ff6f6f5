"""Which steps of a program see only finite values in a run whose inputs and params are
finite (``TorchNet`` checks those per run; ``ops.fused_relu.finite_run`` holds the answer).

Such a run can make no NaN or infinity but through a layer that makes one from finite values
(a Log, a Power, a lone BatchNorm whose variance is below -eps) or a float32 overflow past
3.4e38, where the order of a product's additions (not Caffe's anyway) already decides
between infinity and NaN. So a step after only FINITE_PRESERVING layers sees finite values,
and the passes give it a faster form that differs from Caffe's only at NaN or infinity: a
plain ReLU in oneDNN's epilogue (``relu_fusion``), a MAX pooling without its NaN check
(``finite_pooling``).
"""

from __future__ import annotations

import math
from typing import Any

from ...proto import caffe_pb2
from ..program import LayerStep
from .program import OptimizedProgram

# Layer types (and the parts of a merged step) whose tops are finite when their bottoms and
# params are, overflow aside. A folded BatchNorm counts (the fold checks its own weights,
# ``FoldedAffine``); a BatchNorm alone does not (a variance below -eps gives NaN); Pooling,
# LRN and Eltwise count with the parameters ``finite_preserving`` checks.
FINITE_PRESERVING = frozenset(
    {
        "Input",
        "Convolution",
        "Deconvolution",
        "InnerProduct",
        "Scale",
        "Bias",
        "ReLU",
        "Split",
        "Concat",
        "Dropout",
        "Eltwise",
        "Pooling",
        "LRN",
    }
)
PP = caffe_pb2.PoolingParameter


def finite_preserving(step: LayerStep, runner: Any) -> bool:
    """Does this step make finite tops from finite bottoms and params (overflow aside)?"""
    kinds = step.type.split("+")
    if kinds == ["BatchNorm"]:
        return False  # alone; merged, it is a fold
    if not FINITE_PRESERVING.union({"BatchNorm"}).issuperset(kinds):
        return False
    if step.type == "Pooling":
        return getattr(runner, "pool", None) in (PP.MAX, PP.AVE)
    if step.type == "LRN":  # k + alpha / n * sum(x^2) >= k > 0
        return runner.k > 0 and runner.alpha >= 0 and math.isfinite(runner.beta)
    if step.type == "Eltwise":
        return all(math.isfinite(c) for c in runner.coeff)
    return True


def finite_before(program: OptimizedProgram) -> list[bool]:
    """Per step j: does every step before it keep finite values finite?"""
    before = [True]
    for step in program.steps:
        before.append(before[-1] and finite_preserving(step, program.runners[step.key]))
    return before
