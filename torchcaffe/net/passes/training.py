"""Passes for runs that autograd records (training, or any forward with grad enabled).

``fold_frozen_batchnorm_for_training``: a Convolution followed by a BatchNorm with frozen
(global) statistics and its Scale / Bias, as the inference fold takes them, runs as one
convolution whose weights and bias autograd derives from the blobs on each call
(w * gamma / std, (b - mean) * gamma / std + beta). The chain's per-channel arithmetic over
the activations, forward and backward, becomes arithmetic over the weights, and autograd
keeps no BatchNorm input: for a deploy-style net (``use_global_stats: true``) at batch 8, one
thread, CPU time median of 16 (12) interleaved, MobileNetV2 forward+backward 797 -> 558 ms
(hand-written torch 772), ResNet-50 2523 -> 2358 ms (2499). Gradients reach the same blobs
(conv weight and bias, Scale and Bias params) with the rounding of another summation order
(the golden cases' tolerances hold); the statistics get none, as in Caffe. A BatchNorm
switched to batch statistics after the program was built (``train()`` on that layer alone)
runs the literal chain. Off the CPU (eagerly and compiled) the convolution runs, then BatchNorm
and Scale as one ``F.batch_norm``: there the fold's small ops cost more in launches than they
save.

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

import math
from typing import Any

import torch
import torch.nn.functional as F

from ...ops._conv_spec import spec_conv_output
from ...ops._transforms import refuse_stats_update, under_func_transform
from ...ops.base import CaffeLayer
from ...ops.eltwise import EltwiseLayer, EltwiseOp
from ..program import LayerStep
from .folding import FoldedAffine, one_buffer, producer_chains
from .inplace import rewrite_relus_in_place
from .program import OptimizedProgram, StepMerges, readers_of, step_kind
from .splits import bypass_unobserved_splits

FOLD_PASS = "fold_frozen_batchnorm_for_training"
FUSE_PASS = "fuse_batchnorm_scale_for_training"
SPLIT_PASS = "bypass_splits_for_training"
RELU_PASS = "inplace_relu_for_training"
# A frozen fold whose convolution has this many weights per value of its top, or more, runs
# the convolution, then one batch norm (``FrozenBatchNormFold.weights_outweigh_top``). 2
# threads, medians of per-round ratios against the fold everywhere, alternated in one
# process: a forward that autograd records, ResNet-50 batch 1, 1.35-1.37x (factor 1: 1.37x,
# 4: 1.37-1.42x); forward+backward at batch 8, where no layer of the four benchmark nets
# reaches 16, 0.99-1.02x (factors 1 and 4: 0.97-1.01x); MobileNetV2's recorded batch-1
# forward, whose weights are 1-7x their tops, read 0.95x at factor 1 and 0.97x at 4.
WEIGHT_PER_TOP = 16
# Producers whose backward reads their inputs (or nothing), never their output.
OUTPUT_FREE_BACKWARD = frozenset(
    {"Convolution", "Deconvolution", "InnerProduct", "BatchNorm", "Scale", "Bias"}
)


class FrozenBatchNormFold(FoldedAffine):
    """A Convolution with its frozen BatchNorm / Scale / Bias folded in, differentiably."""

    __slots__ = ("chain", "one_batch_norm")
    shares_with_graph = False  # no packed weight: a compiled inference graph builds its own

    def __init__(self, producer: Any, links: dict[str, Any], chain: list[Any]) -> None:
        super().__init__("Convolution", producer, links)
        self.chain = chain  # the links in program order, for the literal fallback
        self.weight_cache = None  # the weights are new tensors each call: nothing to key on
        channels = None if self.bn is None else self.bn.mean.shape
        scale_shapes = [] if self.scale is None else [t.shape for t in self.scale.param_blobs()]
        self.one_batch_norm = all(shape == channels for shape in scale_shapes)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bn is not None and not self.bn.uses_global_stats:
            return self.literal_top(x)  # batch statistics now: the layers one by one
        if self.launch_bound(x):
            return self.producer_then_batch_norm(x)
        # Under torch.compile too: the inference fold's compiled paths detach the links.
        compiling = torch.compiler.is_compiling()
        if not compiling and self.weights_outweigh_top(x):
            with torch.no_grad():  # (a, c) only for the check: no autograd nodes
                a, c = self._affine(wide=False)
            if self.non_finite(a, c):
                return self.literal_top(x)
            return self.producer_then_batch_norm(x)
        a, c = self._affine(wide=False, detach=False)
        if self.non_finite(a, c):
            return self.literal_top(x)
        if compiling:
            a, c = one_buffer(a, c)  # computed once, not in each kernel reading them
        w, b = self.scaled_by(a, c)
        if compiling and not torch.is_autocast_enabled(x.device.type):
            return self.bias_after(self.run_folded(x, w, None), b)
        return self.run_folded(x, w, b)

    @staticmethod
    def bias_after(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """The folded bias added to the convolution's top as a graph op of its own. Inductor
        fuses it into the next pointwise op (the ReLU, the residual sum), and its gradient's
        sum over the top into that op's backward; given to the convolution, oneDNN's backward
        sums it on its own. ResNet-50 compiled, batch 8, 2 threads: the backward of its four
        64 -> 256 1x1 convolutions at 56x56 took 32-34 ms a step with the bias, 24-25 ms
        without (hand-written: 25 ms); forward+backward, medians of 12-16 alternated in one
        process, 1.0-2.2% faster (MobileNetV2: 4%). Not eagerly, where the add and its sum
        would be two more passes; nor under autocast, where the convolution rounds its top
        before the bias would be added."""
        return y + bias.reshape((1, -1) + (1,) * (y.dim() - 2))

    @staticmethod
    def non_finite(a: torch.Tensor, c: torch.Tensor) -> bool:
        """Is the chain's per-channel affine (a, c), eagerly on the CPU, not all finite? An
        infinite Scale (or a zero variance with eps 0) gives +-inf filters whose products over
        mixed signs sum to NaN, where Caffe's chain gives +-inf: the chain then runs layer by
        layer. (A read of one value; not in a trace, nor where it would sync a device. A
        non-finite convolution weight needs no check: folded or not, it reaches the same
        outputs.) The sum of a + c is finite only if every value is (a sum past float32's
        range also takes the chain: exact, only slower): 3 small ops a layer, where
        ``isfinite(...).all()`` of each took 10 and two reads."""
        if torch.compiler.is_compiling() or not a.is_cpu:
            return False
        with torch.no_grad():
            try:
                return not math.isfinite(float((a + c).sum()))
            except RuntimeError:
                if not under_func_transform():
                    raise
                # vmap over the params (an ensemble): no value to branch on, so the chain
                # runs layer by layer, exact for every member
                return True

    def literal_top(self, x: torch.Tensor) -> torch.Tensor:
        """The producer, then each link in program order (``chain``), as Caffe runs them."""
        y = self.producer(x)
        for link in self.chain:
            y = link(y)
        return y

    def launch_bound(self, x: torch.Tensor) -> bool:
        """Whether the fold's small ops cost more than they save: on a GPU. Eagerly, the
        differentiable fold's ~14 small kernels per layer, forward and backward, kept
        ResNet-50's batch-8 forward+backward on an H200 bound by their launches: 34 ms of
        host time against 12 ms for the hand-written model (1929 kernels against 656).
        Compiled too: inductor fuses them, but the weight's arithmetic and the per-channel
        one are kernels of their own beside the top's, forward and backward (ResNet-50's
        traced step: 1033 + 1134 aten ops against the hand-written 339 + 547), where
        BatchNorm over the top fuses into the kernels the top needs anyway."""
        return not x.is_cpu and self.bn is not None and self.one_batch_norm

    def weights_outweigh_top(self, x: torch.Tensor) -> bool:
        """Eagerly, does the convolution's weight hold WEIGHT_PER_TOP times as many values as
        its top over ``x``, or more? Then scaling the weight costs more than BatchNorm over
        the top, which runs as one batch-norm kernel each way: ResNet-50's last stage at
        batch 1 (2.4M weights of a 3x3 512 -> 512 against a 25K top)."""
        if self.bn is None or not self.one_batch_norm:
            return False
        spec = self.graph_settings[7]
        assert spec is not None
        top = math.prod(spec_conv_output(spec, tuple(x.shape[2:])))
        top *= x.shape[0] * self.graph_settings[6]
        return self.producer.weight.numel() >= WEIGHT_PER_TOP * top

    def producer_then_batch_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The convolution, then BatchNorm and its Scale as one ``F.batch_norm`` on the
        frozen statistics (as ``nn.BatchNorm2d`` in eval: one kernel each way), then Bias."""
        return self.batch_norm_after(self.producer(x))

    def batch_norm_after(self, y: torch.Tensor) -> torch.Tensor:
        """BatchNorm, its Scale and Bias over the convolution's top ``y``, as
        ``producer_then_batch_norm`` runs them."""
        assert self.bn is not None
        mean, var = self.bn.global_stats()
        scale, weight, bias = self.scale, None, None
        if scale is not None:
            weight = scale.weight
            bias = scale.bias if self.scale_has_bias else None
        # the statistics in the Scale's dtype: under autocast a bfloat16 top meets float32
        # params, a mix torch's batch_norm takes only with every param float32
        dtype = y.dtype if weight is None else weight.dtype
        y = F.batch_norm(y, mean.to(dtype), var.to(dtype), weight, bias, eps=self.bn.eps)
        return self.bias(y) if self.bias is not None else y

    def folded_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The folded (weight, bias), recorded by autograd (no cache: the params change every
        step)."""
        return self.weights_in_graph(detach=False)


def _fold_links_ok(chain: list[tuple[int, LayerStep]]) -> bool:
    return all(all(s.propagate_down) for _, s in chain)


def fold_frozen_batchnorm_for_training(
    program: OptimizedProgram, observable: frozenset[str]
) -> OptimizedProgram:
    merges = StepMerges(program)
    for i, step, module, chain, blob in producer_chains(merges, observable):
        if step.type != "Convolution" or not all(step.propagate_down):
            continue
        if not any(s.type == "BatchNorm" for _, s in chain) or not _fold_links_ok(chain):
            continue  # nothing frozen to fold: Scale alone stays (its own backward is cheap)
        links = {s.type: program.runners[s.key] for _, s in chain}
        fold = FrozenBatchNormFold(module, links, [program.runners[s.key] for _, s in chain])
        merges.merge(i, chain, fold, "frozen-folded", (blob,))
    return merges.result(FOLD_PASS)


class TrainingBatchNormScale:
    """BatchNorm (batch statistics) + Scale [+ its bias] in one ``F.batch_norm``."""

    __slots__ = ("bn", "scale", "bias_term")

    def __init__(self, bn: Any, scale: Any) -> None:
        self.bn = bn
        self.scale = scale
        self.bias_term = bool(scale.param.bias_term)  # read once: this runs per forward

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        bn, scale = self.bn, self.scale
        bias = scale.bias if self.bias_term else None
        # the statistics in the Scale's dtype: under autocast a bfloat16 ``x`` meets float32
        # params, a mix torch's batch_norm takes only with every param float32
        dtype = scale.weight.dtype
        if bn.uses_global_stats:  # frozen statistics (fine-tuning a deploy-style net)
            mean, var = bn.global_stats()
            if mean.dtype != dtype:
                mean, var = mean.to(dtype), var.to(dtype)
            return F.batch_norm(x, mean, var, scale.weight, bias, eps=bn.eps)
        refuse_stats_update(bn)  # as the layer itself does, naming it
        if x.numel() // x.shape[1] <= 1:
            return scale(bn(x))  # one value per channel: the layer's own arithmetic
        batch_mean = torch.zeros(x.shape[1], dtype=dtype, device=x.device)
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
    merges = StepMerges(program)
    for i, step in enumerate(program.steps):
        if merges.absorbed(i):
            continue
        j = _pair_ok(program, i, observable)
        if j is None:
            continue
        scale_step = program.steps[j]
        fused = TrainingBatchNormScale(program.runners[step.key], program.runners[scale_step.key])
        merges.merge(i, [(j, scale_step)], fused, f"{scale_step.key}+fused", scale_step.tops)
    return merges.result(FUSE_PASS)


def bypass_splits_for_training(
    program: OptimizedProgram, observable: frozenset[str]
) -> OptimizedProgram:
    return bypass_unobserved_splits(program, observable, SPLIT_PASS)


def _backward_reads_no_output(program: OptimizedProgram, step: LayerStep) -> bool:
    """Whether ``step``'s backward leaves its top alone: OUTPUT_FREE_BACKWARD, and Eltwise but
    a PROD with Caffe's unstable gradient (top_diff * top / bottom reads the top) and one
    written in place over bottom 0 (whose backward reads the top as bottom 0's data)."""
    runner = program.runners[step.key]
    if step.type == "Eltwise" and isinstance(runner, EltwiseLayer):
        if runner.in_place:
            return False
        return runner.operation != EltwiseOp.PROD or runner.stable_prod_grad
    return step_kind(step) in OUTPUT_FREE_BACKWARD


def inplace_relu_for_training(
    program: OptimizedProgram, observable: frozenset[str]
) -> OptimizedProgram:
    return rewrite_relus_in_place(
        program, lambda step: _backward_reads_no_output(program, step), RELU_PASS
    )
