"""fold_batchnorm_scale_into_producer: BatchNorm (global stats) + Scale + Bias into the
Convolution, Deconvolution or InnerProduct before them.

Legality is decided as OpenCV dnn's fuseLayers does: the producer's value is read by exactly
one layer (the next link), and a link that is not in place only extends the chain when its
bottom blob is not observable (Caffe's usual ``conv -> bn -> scale`` in place keeps one name,
whose final value the folded step computes). The folded weights are a derived view, computed
with ``torch.nn.utils.fusion`` and cached on the source tensors' versions, storage, device and
dtype, so loading weights, an optimizer step, ``.to()`` or ``.double()`` make them follow.
Under torch.compile, which does not freeze params, nothing can be cached: a Convolution whose
weight is smaller than one sample's top is folded in the graph (in its own dtype), and any
other producer runs as it is, followed by the chain as one per-channel multiply-add.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch.nn.utils.fusion import fuse_conv_bn_weights

from ...ops import frozen_graph, fused_relu, onednn_linear, opaque_conv
from ...ops._conv_spec import Spec, spec_conv_output, spec_extra_pad
from ...ops._derived import DerivedCache
from ...ops.base import CaffeLayer, blob_slots, read_slots
from ...ops.batch_norm import scaled_stats
from ...ops.convolution import conv2d
from ...ops.onednn_conv import PackedConvWeight
from ..program import LayerStep
from .program import OptimizedProgram, StepMerges, readers_of

PASS_NAME = "fold_batchnorm_scale_into_producer"
PRODUCERS = ("Convolution", "Deconvolution", "InnerProduct")
LINKS = ("BatchNorm", "Scale", "Bias")  # the order a chain may take (each at most once)
# each fold layer's param blobs in Caffe order (a prefix of them: a bias is optional)
BLOB_NAMES = {
    "Convolution": ("weight", "bias"),
    "Deconvolution": ("weight", "bias"),
    "InnerProduct": ("weight", "bias"),
    "BatchNorm": ("mean", "variance", "scale_factor"),
    "Scale": ("weight", "bias"),
    "Bias": ("bias",),
}
# What a traced fold reads of its layers' settings, as one tuple of literals: (the
# producer's type, producer has a bias, Scale has a bias, a Bias link, BatchNorm's eps (0.0
# without one), the Convolution's group and num_output (1 and 0 otherwise), the producer's
# geometry (``ConvGeometry.spec``; None for an InnerProduct or no producer)). Read from the
# layers, each would be one more guard node that a compiled call checks: dynamo guards a
# tuple of literals held under a module with one check (MobileNetV2: ~7 nodes a fold; the
# geometry through ``producer.geom`` three more: its guard lookup 664-779 -> 580-747 us).
GraphSettings = tuple[str, bool, bool, bool, float, int, int, Spec | None]
# The dicts that held the producer's, BatchNorm's, Scale's and Bias's blobs when the fold was
# built (None: no such layer), where a trace reads them (``_blob``).
GraphDicts = tuple[dict[str, Any] | None, ...]


def producer_ok(step: LayerStep, module: Any) -> bool:
    if step.type not in PRODUCERS or len(step.bottoms) != 1 or len(step.tops) != 1:
        return False
    if step.type == "InnerProduct":
        return bool(module.axis == 1)
    geom = module.geom
    if geom.channel_axis != 1 or not 1 <= geom.num_spatial <= 3:
        return False
    return step.type == "Convolution" or bool(module.group == 1)


def _link_ok(step: LayerStep, module: Any, channels: int) -> bool:
    if step.type not in LINKS or len(step.bottoms) != 1 or len(step.tops) != 1:
        return False
    if step.type == "BatchNorm":
        return bool(module.uses_global_stats) and tuple(module.mean.shape) == (channels,)
    if step.type == "Scale" and not module.has_scale_blob:
        return False
    operand = module.weight if step.type == "Scale" else module.bias
    return bool(module.param.axis == 1) and tuple(operand.shape) == (channels,)


def _channels(step: LayerStep, module: Any) -> int:
    return int(module.param.num_output)


def collect_chain(
    program: OptimizedProgram,
    at: int,
    blob: str,
    channels: int,
    order: int,
    observable: frozenset[str],
) -> tuple[list[tuple[int, LayerStep]], str]:
    """The legal BatchNorm/Scale/Bias links after step ``at`` (which wrote ``blob``)."""
    steps = program.steps
    chain: list[tuple[int, LayerStep]] = []
    while True:
        readers = readers_of(steps, at, blob)
        if len(readers) != 1:
            break
        nxt = steps[readers[0]]
        link = program.runners[nxt.key]
        if not isinstance(link, CaffeLayer) or not _link_ok(nxt, link, channels):
            break
        if LINKS.index(nxt.type) < order or any(nxt.loss_weights):
            break
        if nxt.tops[0] != blob and blob in observable:
            break
        chain.append((readers[0], nxt))
        order = LINKS.index(nxt.type) + 1
        at, blob = readers[0], nxt.tops[0]
    return chain, blob


def fold_batchnorm_into_scale(
    program: OptimizedProgram, observable: frozenset[str]
) -> OptimizedProgram:
    """A BatchNorm (global stats) and the Scale/Bias after it become one multiply-add.

    For chains the producer fold left (its output is observable, as in MobileNetV2's
    ``conv1 -> conv1/bn -> conv1/scale`` seen through the Caffe face).
    """
    merges = StepMerges(program)
    for i, step in enumerate(program.steps):
        module = program.runners[step.key]
        if merges.absorbed(i) or step.type != "BatchNorm" or not isinstance(module, CaffeLayer):
            continue
        stats: Any = module.mean
        channels = int(stats.shape[0])
        if not _link_ok(step, module, channels) or any(step.loss_weights):
            continue
        chain, blob = collect_chain(program, i, step.tops[0], channels, 1, observable)
        if not chain:
            continue
        links = {s.type: program.runners[s.key] for _, s in [(i, step), *chain]}
        merges.merge(i, chain, FoldedAffine("BatchNorm", None, links), "folded", (blob,))
    return merges.result("fold_batchnorm_into_scale")


def producer_chains(
    merges: StepMerges, observable: frozenset[str]
) -> Iterator[tuple[int, LayerStep, Any, list[tuple[int, LayerStep]], str]]:
    """(index, step, module, chain, final blob) of every producer not yet merged with a legal
    BatchNorm/Scale/Bias chain after it; lazily, so a merge made by the caller for one
    producer is seen before the next is checked."""
    program = merges.program
    for i, step in enumerate(program.steps):
        module = program.runners[step.key]
        if merges.absorbed(i) or not isinstance(module, CaffeLayer):
            continue
        if not producer_ok(step, module) or any(step.loss_weights):
            continue
        chain, blob = collect_chain(
            program, i, step.tops[0], _channels(step, module), 0, observable
        )
        if chain:
            yield i, step, module, chain, blob


def fold_batchnorm_scale_into_producer(
    program: OptimizedProgram, observable: frozenset[str]
) -> OptimizedProgram:
    merges = StepMerges(program)
    for i, step, module, chain, blob in producer_chains(merges, observable):
        links = {s.type: program.runners[s.key] for _, s in chain}
        merges.merge(i, chain, FoldedAffine(step.type, module, links), "folded", (blob,))
    return merges.result(PASS_NAME)


class FoldedAffine:
    """Runs a producer with BatchNorm/Scale/Bias folded into its weights (inference only)."""

    __slots__ = (
        "producer_type",
        "producer",
        "bn",
        "scale",
        "bias",
        "scale_has_bias",
        "producer_has_bias",
        "_folded",
        "weight_cache",
        "_source_slots",
        "_finite",
        "graph_settings",
        "graph_dicts",
    )

    shares_with_graph: ClassVar[bool] = True  # may a compiled graph's op run it (inference)?

    def __init__(self, producer_type: str, producer: Any, links: dict[str, Any]) -> None:
        self.producer_type = producer_type
        self.producer = producer
        self.bn = links.get("BatchNorm")
        self.scale = links.get("Scale")
        self.bias = links.get("Bias")
        # read once: a proto field read in a compiled forward is one more guard per call
        self.scale_has_bias = bool(self.scale is not None and self.scale.param.bias_term)
        self.producer_has_bias = producer is not None and len(producer.blob_names) > 1
        named = [(producer_type, producer), *links.items()] if producer else list(links.items())
        for kind, layer in named:  # ``_traced`` reads the blobs by these names
            names = layer.blob_names
            assert names == list(BLOB_NAMES[kind][: len(names)]), (kind, names)
        self._folded: DerivedCache[tuple[torch.Tensor, torch.Tensor]] = DerivedCache()
        self.weight_cache: PackedConvWeight | None = PackedConvWeight()
        self._finite = True  # are the folded weights finite (``_fold`` sets it)?
        self._source_slots = blob_slots(self.layers())  # in ``param_blobs`` order
        self.graph_settings = self._settings()
        self.graph_dicts: GraphDicts = (
            None if producer is None else producer._parameters,
            None if self.bn is None else self.bn._buffers,  # Caffe masks them from the solver
            None if self.scale is None else self.scale._parameters,
            None if self.bias is None else self.bias._parameters,
        )
        if (
            self.shares_with_graph
            and producer_type == "Convolution"
            and not torch.compiler.is_compiling()
        ):
            # a compiled graph's op for these layers runs this fold, sharing its caches
            # (one built in a trace is not kept: ``opaque_conv`` builds its own)
            key = tuple(layer.graph_handle for layer in self.layers())
            getattr(producer, "graph_folds", {}).setdefault(key, self)

    def _settings(self) -> GraphSettings:
        """The layers' settings that a traced forward reads (``GraphSettings``), read once."""
        p, bn = self.producer, self.bn
        conv = self.producer_type == "Convolution"
        return (
            self.producer_type,
            self.producer_has_bias,
            self.scale_has_bias,
            self.bias is not None,
            float(bn.eps) if bn is not None else 0.0,
            int(p.group) if conv else 1,
            int(p.num_output) if conv else 0,
            p.geom.spec if self.producer_type in ("Convolution", "Deconvolution") else None,
        )

    def layers(self) -> list[Any]:
        """The producer, then the links, in LINKS order."""
        return [m for m in (self.producer, self.bn, self.scale, self.bias) if m is not None]

    def sources(self) -> list[torch.Tensor]:
        """Every tensor the folded weights derive from (the caffemodel's blobs, each layer's
        ``param_blobs``), read from the layers' dicts on every call, so a param replaced
        since shows. Eager only: torch.compile would guard each dict (``_traced`` reads
        the layers' blobs by name)."""
        return read_slots(self._source_slots)

    def folded_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager fold, cached on its sources. Never under torch.compile: ``__call__``
        takes ``compiled_fold`` there (``_fold`` builds nn.Parameters, which dynamo cannot
        trace, and the version key would break the graph)."""
        return self._folded.get(self.sources(), self._fold)

    @property
    def weights_finite(self) -> bool:
        """Are the folded weights last computed (``folded_weights``) all finite?"""
        return self._finite

    def forget(self) -> None:
        """Drop the folded weights: a source was written where its version does not show it
        (a numpy view); the next call folds again."""
        self._folded.forget()
        if self.weight_cache is not None:
            self.weight_cache.forget()

    def _affine(self, wide: bool = True, detach: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel (a, c) with chain(y) = y * a + c, where y is the producer's top (or the
        BatchNorm's bottom); computed in float64 (``wide``) or the links' dtype, returned in
        the links' dtype; recorded by autograd unless ``detach``."""
        stats = self.bn.global_stats() if self.bn is not None else None
        scale = None
        if self.scale is not None:
            scale = (self.scale.weight, self.scale.bias if self.scale_has_bias else None)
        bias = self.bias.bias if self.bias is not None else None
        own = self.producer.weight if self.producer is not None else None
        return self._chain_affine(stats, scale, bias, wide, detach, self.graph_settings[4], own)

    def _chain_affine(
        self,
        stats: tuple[torch.Tensor, torch.Tensor] | None,
        scale: tuple[torch.Tensor, torch.Tensor | None] | None,
        bias: torch.Tensor | None,
        wide: bool,
        detach: bool,
        eps: float,
        own_weight: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``_affine`` from the links' values: BatchNorm's (mean, variance) as Caffe reads
        them and its ``eps``, Scale's (gamma, beta or None), Bias's bias; None for a link the
        chain lacks. ``own_weight``: the producer's weight (None without one), whose dtype
        the result takes."""
        blob = torch.Tensor.detach if detach else (lambda t: t)
        if stats is not None:
            ref = stats[0]
        elif scale is not None:
            ref = scale[0]
        else:
            assert bias is not None
            ref = bias
        dtype = torch.float64 if wide else ref.dtype
        # the links' dtype: a 16-bit net's BatchNorm keeps float32 statistics, so the
        # producer's, the Scale's or the Bias's where the chain has one
        others = (own_weight, scale, bias)
        out = next((t[0] if isinstance(t, tuple) else t for t in others if t is not None), ref)
        # as few ops as the chain needs (a training forward records each, per layer): with
        # BatchNorm and a Scale with its bias, a = gamma * rsqrt(var + eps) and
        # c = beta - mean * a are four
        a: torch.Tensor | None = None
        if stats is not None:
            a = torch.rsqrt(blob(stats[1]).to(dtype) + eps)
        beta = None
        if scale is not None:
            gamma = blob(scale[0]).to(dtype)
            a = gamma if a is None else gamma * a
            beta = None if scale[1] is None else blob(scale[1]).to(dtype)
        if a is None:  # a Bias alone
            a = torch.ones(ref.shape[0], dtype=dtype, device=ref.device)
        c: torch.Tensor | None = beta
        if stats is not None:
            mean = blob(stats[0]).to(dtype)
            c = (mean * a).neg() if c is None else torch.addcmul(c, mean, a, value=-1)
        if bias is not None:
            c = blob(bias).to(dtype) if c is None else c + blob(bias).to(dtype)
        if c is None:  # a Scale without bias alone
            c = torch.zeros_like(a)
        return a.to(out.dtype), c.to(out.dtype)

    def weights_in_graph(self, detach: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """A Convolution's (weight, bias) with the chain folded in, in the links' dtype, as ops
        of the running graph: a compiled one, or autograd's unless ``detach``."""
        return self.scaled_by(*self._affine(wide=False, detach=detach))

    def scaled_by(self, a: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Convolution's (weight, bias) with the chain's (a, c) folded in, as graph ops."""
        p = self.producer
        return _scaled_weights(p.weight, p.bias if p.bias_term else None, a, c)

    def _traced(self, x: torch.Tensor) -> torch.Tensor:
        """The fold as torch.compile traces it (inference: nothing is cached, as compile does
        not freeze params).

        - A large Convolution on the CPU is ``opaque_conv``'s op (folded, packed, cached).
        - A chain without producer is one multiply-add with its (a, c).
        - A Convolution at batch 1 on the CPU whose weight has fewer elements than its top
          gets folded weights. The fold adds a bias, which torch's im2col convolution copies
          into its top first: MobileNetV2 b1, one thread, kernels 5.4 -> 0.9 ms for 0.8 ms
          of copies, but at b8 26.7 ms of copies for 10.6 ms of kernels saved.
        - A Convolution in a graph whose params inductor freezes gets folded weights, which
          it computes once and packs (``frozen_graph``).
        - Else the producer runs as it is, then the chain as one multiply-add, which inductor
          fuses into its epilogue. Folded weights would be recomputed on every call:
          ResNet-50 batch 1, one thread, ~30 ms of ~150 ms.

        Each layer's blobs are read once, by name (``BLOB_NAMES``, checked against the layers
        when the fold is built; ``param_blobs`` would guard its list of names item by item),
        and nothing calls a method on a layer: dynamo guards every attribute read and every
        method call (that the instance does not shadow it), and checks those guards on each
        compiled call, with the caches cold after the convolutions (MobileNetV2's forward:
        9,363 guard lines, 0.9 ms a call, against the hand-written model's 5,157 and 0.4 ms).
        """
        p, bn, sc = self.producer, self.bn, self.scale
        kind, own_has_bias, scale_has_bias, has_bias, eps, group, num_output, spec = (
            self.graph_settings
        )
        conv = kind == "Convolution"
        pd, bd, sd, bias_d = self.graph_dicts
        own = [] if p is None else [_blob(pd, p, "weight")]
        if p is not None and own_has_bias:
            own.append(_blob(pd, p, "bias"))
        stats_blobs = [] if bn is None else [_blob(bd, bn, n) for n in BLOB_NAMES["BatchNorm"]]
        scale_blobs = [] if sc is None else [_blob(sd, sc, "weight")]
        if sc is not None and scale_has_bias:
            scale_blobs.append(_blob(sd, sc, "bias"))
        # ``has_bias`` first: without a Bias link ``self.bias`` is not read (one guard node
        # less); the ``is not None`` only narrows the type
        bias_blobs = (
            [_blob(bias_d, self.bias, "bias")] if has_bias and self.bias is not None else []
        )
        sources = own + stats_blobs + scale_blobs + bias_blobs  # as ``sources()`` lists them
        if conv and spec is not None and opaque_conv.wanted(spec, x, sources, group):
            return opaque_conv.call(x, sources, self.layers())
        stats = scaled_stats(*stats_blobs) if stats_blobs else None
        scale = None
        if scale_blobs:
            scale = (scale_blobs[0], scale_blobs[1] if scale_has_bias else None)
        bias = bias_blobs[0] if bias_blobs else None
        own_weight = own[0] if own else None
        a, c = self._chain_affine(
            stats, scale, bias, wide=False, detach=True, eps=eps, own_weight=own_weight
        )
        own_bias = own[1] if len(own) > 1 else None
        if conv and (
            frozen_graph.params_frozen() or _folding_pays_at_batch_1(spec, x, own[0], num_output)
        ):
            # (a, c) left to inductor to inline: the weight's kernel computes them with it,
            # where a stack would add a buffer and its aliases to each call (MobileNetV2
            # batch 1: 121 -> 39 ``reinterpret_tensor`` calls, 0.95-0.96x -> 0.97x)
            return self.run_folded(x, *_scaled_weights(own[0], own_bias, a, c))
        if x.is_cpu:
            # a GPU's inference call is bound by its launches, where the stack's kernel is one
            # more (an H200, compiled ResNet-50 b1: 12 a call); its epilogues then compute the
            # chain's (a, c) themselves, as nn.BatchNorm2d's do
            a, c = one_buffer(a, c)
        if p is None:
            return self.run_folded(x, a, c)
        y = self.run_folded(x, own[0], own_bias) if conv else p(x)
        if y.dtype != a.dtype:  # autocast's 16-bit top: stay in its dtype, as eagerly
            a, c = a.to(y.dtype), c.to(y.dtype)
        view = (1, -1) + (1,) * (y.dim() - 2)
        return torch.addcmul(c.reshape(view), y, a.reshape(view))

    def _fold(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The chain as one BatchNorm (mean, var, eps, gamma, beta) fused by torch's helpers,
        in float64, then cast back to the producer's dtype; notes whether all are finite (a
        variance below -eps, or an overflow, makes them not; off the CPU nothing is read)."""
        folded = self._fold_values()
        self._finite = all(t.is_cpu and bool(torch.isfinite(t).all()) for t in folded)
        return folded

    def _fold_values(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.producer is None:
            return self._affine()
        p = self.producer
        w = p.weight.detach()
        dtype = w.dtype
        w64 = w.double()
        if self.producer_type == "InnerProduct" and p.transpose:
            w64 = w64.t()
        c = w64.shape[1] if self.producer_type == "Deconvolution" else w64.shape[0]
        b = p.bias.detach().double() if p.param.bias_term else w64.new_zeros(c)
        mean, var, eps = w64.new_zeros(c), w64.new_ones(c), 0.0
        if self.bn is not None:
            m, v = self.bn.global_stats()
            mean, var, eps = m.detach().double(), v.detach().double(), self.bn.eps
        gamma, beta = w64.new_ones(c), w64.new_zeros(c)
        if self.scale is not None:
            gamma = self.scale.weight.detach().double()
            if self.scale.param.bias_term:
                beta = self.scale.bias.detach().double()
        if self.bias is not None:
            beta = beta + self.bias.bias.detach().double()
        deconv = self.producer_type == "Deconvolution"  # output channels on axis 1
        fw, fb = fuse_conv_bn_weights(w64, b, mean, var, eps, gamma, beta, transpose=deconv)
        return fw.detach().to(dtype), fb.detach().to(dtype)

    def eager_top(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_folded(x, *self.folded_weights())

    def top_with_relu(self, x: torch.Tensor, slope: fused_relu.Slope) -> torch.Tensor:
        """The folded top, then a ReLU of ``slope`` if any (``fused_relu``)."""
        if torch.compiler.is_compiling():
            return fused_relu.apply_(self._traced(x), slope)
        w, b = self.folded_weights()
        slope = fused_relu.after_derived_weights(slope, self._finite)
        if self.folds_non_finite(w):
            return fused_relu.apply_(self.literal_top(x), slope)
        if self.producer_type == "Convolution" and self.weight_cache is not None and x.is_cpu:
            # the packed call made last, before ``run_folded``'s own checks: a bottom of the
            # shape that call had needs no extra pad (it had none, or was the padded one)
            geometry = (*self.producer.geom.torch_args(), self.producer.group)
            y = self.weight_cache.replay(x, w, b, geometry, slope)
            if y is not None:
                return y
        return self.run_folded(x, w, b, relu=slope)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.top_with_relu(x, None)

    def folds_non_finite(self, weight: torch.Tensor) -> bool:
        """Did the last fold (of ``weight``, on the CPU) give a NaN or an infinity? Then the
        fold is not Caffe's: an infinite Scale or a zero variance with eps 0 gives each
        output channel infinite weights, whose products over mixed signs sum to NaN where
        Caffe's chain gives +-inf. (Off the CPU nothing is read: see ``_fold``.)"""
        return not self._finite and weight.is_cpu

    def literal_top(self, x: torch.Tensor) -> torch.Tensor:
        """The producer and then each link, layer by layer, as Caffe runs them."""
        y = x if self.producer is None else self.producer(x)
        for link in (self.bn, self.scale, self.bias):
            if link is not None:
                y = link(y)
        return y

    def run_folded(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        b: torch.Tensor | None,
        relu: fused_relu.Slope = None,
    ) -> torch.Tensor:
        """The producer with weights ``w`` and bias ``b`` (or none); alone: ``x * w + b`` per
        channel. Then the ReLU of slope ``relu``, if any (``fused_relu``)."""
        p = self.producer
        if p is None:  # BatchNorm (+ Scale/Bias) alone: one fused multiply-add over axis 1
            assert b is not None
            if w.dtype != x.dtype:  # a BatchNorm alone in a 16-bit net: float32 statistics
                w, b = w.to(x.dtype), b.to(x.dtype)
            view = (1, -1) + (1,) * (x.dim() - 2)
            return fused_relu.apply_(torch.addcmul(b.reshape(view), x, w.reshape(view)), relu)
        kind, group, spec = self.graph_settings[0], self.graph_settings[5], self.graph_settings[7]
        if kind == "InnerProduct":
            return onednn_linear.linear(x.reshape(x.shape[0], p.k), w, b, relu)
        assert spec is not None  # a Convolution's or Deconvolution's geometry
        n = len(spec[1])
        stride, pad, dilation = spec[2], spec[3], spec[4]
        if kind == "Deconvolution":
            deconv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[n - 1]
            return fused_relu.apply_(deconv(x, w, b, stride, pad, 0, 1, dilation), relu)
        extra = spec_extra_pad(spec, tuple(x.shape[2:]))
        if any(extra):
            x = F.pad(x, [v for e in reversed(extra) for v in (0, e)])
        if n == 2:
            # a trace reads no cache (``conv2d``): not even whether there is one, a guard
            cache = None if torch.compiler.is_compiling() else self.weight_cache
            return conv2d(x, w, b, stride, pad, dilation, group, cache, relu)
        conv = F.conv1d if n == 1 else F.conv3d
        return fused_relu.apply_(conv(x, w, b, stride, pad, dilation, group), relu)


def _folding_pays_at_batch_1(
    spec: Spec | None, x: torch.Tensor, weight: torch.Tensor, num_output: int
) -> bool:
    """At batch 1 on the CPU, a Convolution (of geometry ``spec``) whose weight has fewer
    elements than its top: scaling the weight costs less than scaling the top (see
    ``FoldedAffine._traced``). Not on a GPU, where a batch-1 call is bound by the host's
    launches: the scaled weight is one kernel more per convolution, and the epilogue's
    multiply-add is fused into a kernel that runs anyway (an H200, torch 2.11, compiled
    ResNet-50 b1: 311 launches a call against the hand-written model's 242, MobileNetV2 241
    against 146, host time 3.8 against 3.3 and 5.3 against 4.5 ms)."""
    if x.shape[0] != 1 or not x.is_cpu:
        return False
    assert spec is not None
    top = num_output * math.prod(spec_conv_output(spec, tuple(x.shape[2:])))
    return weight.numel() < top


def _blob(where: dict[str, Any] | None, layer: Any, name: str) -> torch.Tensor:
    """A layer's blob as a trace reads it: from the dict it lived in when the fold was built
    (``graph_dicts``), so that dynamo's path to it skips the layer and its ``__dict__``
    (MobileNetV2: its cold guard check 46-78 us less). A blob moved since (weight sharing's
    ``set_param_blob``, a parametrization) is read as an attribute; the check of the dict
    makes a later move retrace."""
    if where is not None and name in where:
        return where[name]
    return getattr(layer, name)


def _scaled_weights(
    weight: torch.Tensor, bias: torch.Tensor | None, a: torch.Tensor, c: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A convolution's (weight, bias) with the chain y * a + c folded in: each output
    channel's filter times a, its bias b * a + c (c where it has none)."""
    w = weight * a.reshape((-1,) + (1,) * (weight.dim() - 1))
    return w, (bias * a + c if bias is not None else c)


def one_buffer(a: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A traced chain's (a, c) as the rows of one stacked tensor. Inductor inlines a pointwise
    function of small tensors into each kernel that reads it, so the kernels that apply the
    chain (and, in a training graph, their backward kernels) would recompute BatchNorm's
    arithmetic (a reciprocal, a rsqrt, a where) for every vector of channels they write: 11
    ops where nn.BatchNorm2d's epilogue has 6. A stack (a cat) is a buffer of its own,
    computed once per call. Compiled, 2 threads: MobileNetV2 inference at batch 8 91 -> 83
    ms; forward+backward at batch 8 (``FrozenBatchNormFold``), median of 16-20 alternated
    steps in one process, five runs each: MobileNetV2 1.017x-1.073x, ResNet-50 0.994x-1.017x."""
    ac = torch.stack((a, c))
    return ac[0], ac[1]


def _fold_for_graph(producer: Any, links: dict[str, Any]) -> FoldedAffine:
    """The eager fold a compiled graph's opaque op runs (``opaque_conv``)."""
    return FoldedAffine("Convolution", producer, links)


opaque_conv.fold_builder = _fold_for_graph
