"""inner_product_on_onednn: a large InnerProduct runs on oneDNN's matmul on the CPU (inference).

``F.linear`` on the CPU goes to MKL's sgemm, which runs a batch-1 product (a matrix-vector
product, bound by reading the weight) on one thread, and skinny batches no better: CaffeNet's
fc6/fc7/fc8 at batch 1 took 10.9 ms of our 20.5 ms against OpenCV dnn's 7.1 ms. oneDNN's
matmul (``torch.ops.mkldnn._linear_pointwise``, which inductor's freezing path also calls)
splits the rows over the threads and reads the plain (N, K) weight as it is, with no packed
copy to keep in sync. Measured at 2 threads, median of 15, ms MKL / oneDNN:
4096x9216 batch 1 7.31 / 3.89, batch 8 15.9 / 8.4, batch 256 137 / 96;
4096x4096 batch 1 4.17 / 1.48; 1000x2048 batch 1 0.21 / 0.11, batch 8 0.75 / 0.38.
At one thread batch 1 is a tie (7.6 / 7.2 ms) and batch 8 still 1.5x faster. Below
MIN_WEIGHTS weights (LeNet's 10x500 classifier) oneDNN's ~20 us per call outweighs the gain.

Only the order of the dot products' additions changes: the outputs stay within the golden
tolerances (tests/net/test_passes_golden.py runs every golden case through it). Any call
oneDNN cannot take as it is (not the CPU, not float32, autograd recording, torch.compile,
which handles ``F.linear`` itself, or ``torch.backends.mkldnn`` off) runs ``F.linear``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from .program import OptimizedProgram

PASS_NAME = "inner_product_on_onednn"
# Weights (N * K) from which oneDNN's matmul is faster than MKL's at every batch measured.
MIN_WEIGHTS = 1 << 18


def _onednn_matmul() -> Any | None:
    """oneDNN's linear op where this torch build has it, else None."""
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(torch.ops.mkldnn, "_linear_pointwise", None)


_LINEAR = _onednn_matmul()


def available() -> bool:
    """Does this torch build have oneDNN's linear op (else the pass rewrites nothing)?"""
    return _LINEAR is not None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a 2-D ``x``, on oneDNN where it can run as is and
    ``weight`` has at least MIN_WEIGHTS elements."""
    if _LINEAR is not None and weight.numel() >= MIN_WEIGHTS and _onednn_can_take(x, weight, bias):
        return _LINEAR(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _onednn_can_take(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """CPU float32 tensors, oneDNN on, no autograd recording (the op has no backward), and
    not under torch.compile (inductor lowers it only for frozen, constant weights)."""
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if not all(t.is_cpu and t.dtype == torch.float32 for t in tensors):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    return bool(torch.backends.mkldnn.enabled) and not torch.compiler.is_compiling()


class OneDnnInnerProduct:
    """Caffe's InnerProduct (``module``'s params, read on every call) through ``linear``."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        lead = x.shape[: m.axis]
        weight = m.weight.t() if m.transpose else m.weight
        bias = m.bias if m.param.bias_term else None
        return linear(x.reshape(-1, m.k), weight, bias).view(*lead, -1)


def inner_product_on_onednn(
    program: OptimizedProgram, observable: frozenset[str]
) -> OptimizedProgram:
    new_steps = list(program.steps)
    runners: dict[str, OneDnnInnerProduct] = {}
    if available():
        for i, step in enumerate(program.steps):
            module: Any = program.runners[step.key]
            if step.type != "InnerProduct" or module.weight.numel() < MIN_WEIGHTS:
                continue
            key = f"{step.key}+onednn"
            runners[key] = OneDnnInnerProduct(module)
            new_steps[i] = dataclasses.replace(step, key=key)
    return program.rewritten(PASS_NAME, new_steps, runners, len(runners))
