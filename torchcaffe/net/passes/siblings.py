"""merge_sibling_convolutions: convolutions that read the same bottom with the same geometry
run as one convolution over their filters stacked, whose top is then split (inference, CPU).

An inception module's 1x1 branches (GoogLeNet's ``1x1``, ``3x3_reduce`` and ``5x5_reduce``;
Inception-v3's) are such siblings: three calls of oneDNN, each small enough at batch 1 that
its fixed cost weighs (``5x5_reduce`` over 14x14: 16 outputs, ~0.2 ms), become one, as
TensorRT's horizontal fusion merges them. GoogLeNet's 9 modules, batch 1, 2 threads, median
of 100 interleaved rounds of the 27 convolutions alone: 6.9 -> 5.8 ms (split copies
included); in-net, median of 61 per-round ratios: 1.025x-1.029x in three readings. Each
output channel is the same dot product as before,
on oneDNN's same kernels (bit-identical on those shapes).

Legal when every sibling reads the value one producer wrote to the bottom, writes one top (not
in place), is 2-D with ``group: 1``, and runs the same ReLU after it (fused by
``fuse_relu_into_producer``, or none). The merged step takes the first sibling's place and
writes every sibling's top. No step between reads or writes a later sibling's top, or
rewrites the bottom: Caffe gives a blob one producer, in place only over a blob that the
in-place layer alone reads. Only the order of independent steps changes and every blob keeps
its value, so observable blobs need no check. Folded siblings
(``FoldedAffine``) stack their folded weights.

Under torch.compile and torch.jit's tracer, and over a bottom of more than MAX_POSITIONS
positions, each sibling runs as before (the stacked weights would be a graph op per call:
compile does not freeze params).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from ...ops import fused_relu
from ...ops._derived import DerivedCache
from ...ops.convolution import ConvolutionLayer, conv2d
from ...ops.onednn_conv import PackedConvWeight, is_channels_last
from ..program import LayerStep
from .folding import FoldedAffine
from .program import OptimizedProgram, bottom_producers, step_kind
from .relu_fusion import ProducerWithReLU

PASS_NAME = "merge_sibling_convolutions"
# Bottom positions (N * H * W) up to which the merged call pays, decided per call: the split
# copies grow with the top while the calls saved cost the same. GoogLeNet's modules, 2
# threads, merged against separate (median of 21 interleaved): batch 8 over 7x7 and 14x14
# (392, 1568) 1.00x-1.07x, over 28x28 (6272) 0.93x-0.98x; batch 1 over 28x28 (784) 1.2x-1.6x.
MAX_POSITIONS = 2048


@dataclass(frozen=True)
class _Sibling:
    index: int
    step: LayerStep
    # what must match across siblings: (bottom, its producer, geometry, input channels,
    # ReLU slope or None, whether that ReLU may run in oneDNN's epilogue in a finite run)
    key: tuple[Any, ...]


def _sibling(
    program: OptimizedProgram, i: int, producers: list[tuple[int | None, ...]]
) -> _Sibling | None:
    """Step ``i`` as a possible sibling: a 2-D Convolution (folded or not, a ReLU fused in or
    not) with one bottom and one top."""
    step = program.steps[i]
    if step_kind(step) != "Convolution" or len(step.bottoms) != 1 or len(step.tops) != 1:
        return None
    if any(step.loss_weights) or step.tops == step.bottoms:
        return None
    runner = program.runners[step.key]
    slope, finite = None, False
    if isinstance(runner, ProducerWithReLU):
        slope, finite, runner = runner.negative_slope, runner.finite_epilogue, runner.runner
    if isinstance(runner, FoldedAffine):
        if runner.producer_type != "Convolution" or runner.weight_cache is None:
            return None
        runner = runner.producer
    if not isinstance(runner, ConvolutionLayer):
        return None
    g = runner.geom
    if g.channel_axis != 1 or g.num_spatial != 2 or runner.group != 1:
        return None
    bottom = step.bottoms[0]
    key = (bottom, producers[i][0], g, runner.channels, slope, finite)
    return _Sibling(i, step, key)


def merge_sibling_convolutions(
    program: OptimizedProgram, observable: frozenset[str]
) -> OptimizedProgram:
    steps = program.steps
    producers = bottom_producers(steps)
    candidates = [s for s in (_sibling(program, i, producers) for i in range(len(steps))) if s]
    merged: dict[int, LayerStep] = {}
    absorbed: set[int] = set()
    runners: dict[str, Any] = {}
    for n, first in enumerate(candidates):
        if first.index in absorbed:
            continue
        group = [first]
        for later in candidates[n + 1 :]:
            tops = {s.step.tops[0] for s in group}
            if later.key == first.key and later.step.tops[0] not in tops:
                group.append(later)
        if len(group) < 2:
            continue
        step = first.step
        key = f"{step.key}+siblings"
        runners[key] = SiblingConvolutions([program.runners[s.step.key] for s in group])
        merged[first.index] = replace(
            step,
            type="+".join(s.step.type for s in group),
            key=key,
            tops=tuple(s.step.tops[0] for s in group),
            loss_weights=tuple(w for s in group for w in s.step.loss_weights),
        )
        absorbed.update(s.index for s in group[1:])
    kept = [merged.get(i, s) for i, s in enumerate(steps) if i not in absorbed]
    return program.rewritten(PASS_NAME, kept, runners, len(merged))


class SiblingConvolutions:
    """Runs sibling convolution steps (``members``: each step's runner, a layer or a fold with
    or without a fused ReLU) as one convolution over their stacked weights; returns their tops
    in order, each a dense tensor of the bottom's layout."""

    __slots__ = ("members", "layers", "sizes", "slope", "finite_epilogue", "_stacked", "_packed")

    def __init__(self, members: list[Any]) -> None:
        self.members = tuple(members)
        first = members[0]
        self.slope: fused_relu.Slope = None
        self.finite_epilogue = False
        if isinstance(first, ProducerWithReLU):  # the same for all (the pass's key)
            self.slope, self.finite_epilogue = first.negative_slope, first.finite_epilogue
        # each member's layer or fold, which computes its (weight, bias)
        self.layers = tuple(m.runner if isinstance(m, ProducerWithReLU) else m for m in members)
        self.sizes = [_conv_of(layer).num_output for layer in self.layers]
        # the members' weights and biases stacked, kept until one of them changes
        self._stacked: DerivedCache[tuple[torch.Tensor, torch.Tensor]] = DerivedCache()
        self._packed = PackedConvWeight()

    @property
    def producer(self) -> ConvolutionLayer:
        """The first member's layer: the geometry all share (the layout pass reads it)."""
        return _conv_of(self.layers[0])

    def forget(self) -> None:
        """Drop the stacked and packed weights: a member's param was written where its version
        does not show it (``TorchNet.params_changed``)."""
        self._stacked.forget()
        self._packed.forget()

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if (
            torch.compiler.is_compiling()
            or torch.jit.is_tracing()
            or x.shape[0] * math.prod(x.shape[2:]) > MAX_POSITIONS
        ):
            return tuple(member(x) for member in self.members)
        sources: list[torch.Tensor] = []
        finite = True
        for layer in self.layers:
            if isinstance(layer, FoldedAffine):
                w, b = layer.folded_weights()
                if layer.folds_non_finite(w):  # that member runs its chain layer by layer
                    return tuple(member(x) for member in self.members)
                finite = finite and layer.weights_finite
                sources += (w, b)
            else:
                sources += (layer.weight, layer.bias) if layer.bias_term else (layer.weight,)
        slope = fused_relu.slope_for_run(self.slope, self.finite_epilogue)
        slope = fused_relu.after_derived_weights(slope, finite)
        weight, bias = self._stacked.get(sources, lambda: self._stack(sources))
        conv = self.producer
        g = conv.geom
        extra = g.extra_pad(tuple(x.shape[2:]))
        if any(extra):
            x = F.pad(x, [v for e in reversed(extra) for v in (0, e)])
        y = conv2d(x, weight, bias, *g.torch_args(), 1, self._packed, slope)
        layout = torch.channels_last if is_channels_last(y) else torch.contiguous_format
        return tuple(part.contiguous(memory_format=layout) for part in y.split(self.sizes, 1))

    def _stack(self, sources: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The members' weights stacked along the outputs, and their biases (zeros for a
        member without one)."""
        weights, biases = [], []
        it = iter(sources)
        for layer, size in zip(self.layers, self.sizes):
            w = next(it)
            has_bias = isinstance(layer, FoldedAffine) or layer.bias_term
            weights.append(w)
            biases.append(next(it) if has_bias else w.new_zeros(size))
        return torch.cat(weights), torch.cat(biases)  # DerivedCache computes without autograd


def _conv_of(layer: Any) -> ConvolutionLayer:
    conv: ConvolutionLayer = layer.producer if isinstance(layer, FoldedAffine) else layer
    return conv
