"""Inference passes over the LayerStep program, applied in ONE place (``optimize_for_inference``).

Each pass is a pure function ``(program, observable) -> program``: it returns new steps and
new runners and leaves the net's modules and params untouched (a fold is a derived view of
the caffemodel's blobs; see ``folding.FoldedAffine``). ``observable`` names the blobs the
caller will read after the run: a pass never removes or changes the final value of one of
them. Inference passes run when no autograd is recorded, training passes when it is;
``TorchNet`` picks the program per call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from torch import nn

from ...ops.base import CaffeLayer
from ..program import LayerStep
from .direct_calls import direct_calls, direct_calls_for_training
from .finite_pooling import finite_pooling
from .folding import (
    FoldedAffine,
    fold_batchnorm_into_scale,
    fold_batchnorm_scale_into_producer,
)
from .inplace import inplace_relu
from .layout import channels_last_layout, to_nchw
from .program import OptimizedProgram
from .relu_fusion import fuse_relu_into_producer
from .siblings import merge_sibling_convolutions
from .splits import bypass_splits
from .training import (
    bypass_splits_for_training,
    fold_frozen_batchnorm_for_training,
    fuse_batchnorm_scale_for_training,
    inplace_relu_for_training,
)

# The inference pipeline, in order: folds into producers first, then what they left (their
# output is observable) into one multiply-add; unobserved Splits bypassed next (after the
# folds, which read a Split as one more reader of the blob it fans out); then a ReLU into
# the (folded) Convolution or InnerProduct before it, and the ReLUs left in place, so a
# ReLU after a folded chain sees a fresh producer and one after a bypassed Split sees every
# reader; sibling convolutions (folded, with their ReLUs) as one, once each is what it will
# run; MAX poolings that see only finite values in a finite run (after the folds, whose
# merged steps count as finite-preserving); the memory layout last, over the steps that will
# really run.
INFERENCE_PASSES = (
    fold_batchnorm_scale_into_producer,
    fold_batchnorm_into_scale,
    bypass_splits,
    fuse_relu_into_producer,
    inplace_relu,
    merge_sibling_convolutions,
    finite_pooling,
    channels_last_layout,
)
# Passes for the CPU's kernels alone. Elsewhere they would only wrap each layer in a call that
# passes its tensors through: on a GPU, where a run is bound by the host's work per layer,
# that costs time for nothing (the finite run is a CPU run, too); the sibling convolutions
# were measured on the CPU alone.
CPU_ONLY_PASSES = frozenset({merge_sibling_convolutions, finite_pooling, channels_last_layout})
# Passes for other devices alone, last: the steps a GPU runs eagerly, as direct torch calls.
OFF_CPU_PASSES = (direct_calls,)


# For runs autograd records: frozen BatchNorm (+ Scale/Bias) into the Convolution before it,
# then the BatchNorm + Scale pairs left fused, so a ReLU after either sees it; unobserved
# Splits are bypassed (their readers read the Split's bottom).
TRAINING_PASSES = (
    fold_frozen_batchnorm_for_training,
    fuse_batchnorm_scale_for_training,
    bypass_splits_for_training,
    inplace_relu_for_training,
)
# Passes for forwards autograd records off the CPU alone, after those: direct torch calls.
OFF_CPU_TRAINING_PASSES = (direct_calls_for_training,)


# The type a step takes for the passes when its module is a user's (``opaque_to_passes``).
USER_MODULE = "user:"


def opaque_to_passes(
    steps: list[LayerStep], modules: Mapping[str, nn.Module] | nn.ModuleDict
) -> list[LayerStep]:
    """``steps``, those whose module a user put in ``net.layers`` (not a CaffeLayer) retyped
    ``user:<Caffe type>``: the passes choose steps by their Caffe type and then read the
    layer's params and methods, which such a module does not have. Under a type no pass
    knows, it runs as it is, in the layout it was written for, and makes nothing finite."""
    return [
        step
        if step.is_input or isinstance(modules[step.key], CaffeLayer)
        else dataclasses.replace(step, type=USER_MODULE + step.type)
        for step in steps
    ]


def optimize_for_inference(
    steps: list[LayerStep],
    modules: Mapping[str, nn.Module] | nn.ModuleDict,
    observable: frozenset[str],
    on_cpu: bool = True,
) -> OptimizedProgram:
    """Run every inference pass over ``steps`` (off the CPU, those not in CPU_ONLY_PASSES);
    the report counts what each pass did."""
    program = OptimizedProgram.unoptimized(opaque_to_passes(steps, modules), modules)
    for apply_pass in INFERENCE_PASSES:
        if on_cpu or apply_pass not in CPU_ONLY_PASSES:
            program = apply_pass(program, observable)
    if on_cpu:
        return program
    for apply_pass in OFF_CPU_PASSES:
        program = apply_pass(program, observable)
    # the finite forms are oneDNN's (the CPU's): a run elsewhere checks for none
    return dataclasses.replace(program, finite_steps=0)


def optimize_for_training(
    steps: list[LayerStep],
    modules: Mapping[str, nn.Module] | nn.ModuleDict,
    observable: frozenset[str],
    on_cpu: bool = True,
) -> OptimizedProgram:
    """Run every training pass over ``steps`` (for forwards that autograd records), and off
    the CPU those of OFF_CPU_TRAINING_PASSES."""
    program = OptimizedProgram.unoptimized(opaque_to_passes(steps, modules), modules)
    for apply_pass in TRAINING_PASSES:
        program = apply_pass(program, observable)
    if not on_cpu:
        for apply_pass in OFF_CPU_TRAINING_PASSES:
            program = apply_pass(program, observable)
    return program


__all__ = [
    "FoldedAffine",
    "CPU_ONLY_PASSES",
    "INFERENCE_PASSES",
    "OFF_CPU_PASSES",
    "OFF_CPU_TRAINING_PASSES",
    "TRAINING_PASSES",
    "OptimizedProgram",
    "optimize_for_inference",
    "optimize_for_training",
    "to_nchw",
]
