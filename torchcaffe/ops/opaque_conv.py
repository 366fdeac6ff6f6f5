"""Inside a torch.compile graph on the CPU, a large 2-D convolution's inference as one opaque
op that runs the eager path: weights folded and packed once (``onednn_conv``), not per call.

torch.compile does not freeze params, so a compiled graph can keep nothing derived from them:
inductor sends each convolution to oneDNN with its plain weight, which oneDNN reorders on
every call, and a folded BatchNorm is recomputed in the graph. That is where the eager net
beat its own compiled form: ResNet-50 batch 1, 2 threads, eager 47-51 ms, compiled 58-66 ms
(the hand-written model compiled: 60-65 ms). Here such a Convolution, alone or with its
BatchNorm/Scale/Bias chain folded in, traces to one custom op,
``torchcaffe::cached_conv2d(x, sources, handles)``: its inputs are the bottom and every tensor
the weights derive from (so the graph orders it after any write to them), ``handles`` name
the producer and link layers, whose eager fold (``FoldedAffine``, built at the first call and
kept on the producer) computes it with its caches. Inductor fuses the ops around it as it
would around its own convolution.

Every layer gets a handle when it is built or copied (``register``): a graph traced while the
net builds its program cannot itself record new objects, since dynamo applies such effects
after the graph's first run. The op checks that the tensors it is given are still those
layers' and raises otherwise rather than compute with weights the graph did not name.
The op is used only where the eager path would pack (``wanted``) and never by torch.export,
whose program must stand alone.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn.utils import parametrize

from ..errors import TorchCaffeError
from . import onednn_conv, onednn_linear
from ._conv_spec import Spec, spec_is_pointwise, spec_layout

# Weights (out * in * kh * kw) from which the op pays: below, its call (~20 us) and the
# channels_last copies it starts outweigh packing a small weight (MobileNetV2 batch 1, every
# dense convolution as the op: 0.76-0.77x the hand-written model compiled, 0.90-0.97x as now).
MIN_WEIGHTS = 1 << 18

_LAYERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)

# (producer, {link type: link layer}) -> the fold's eager step; set by net.passes.folding,
# which builds on this package
fold_builder: Callable[[Any, dict[str, Any]], Any] | None = None


def register(layer: Any) -> int:
    """A new handle for ``layer`` (held weakly: a graph does not keep a layer alive)."""
    handle = next(_HANDLES)
    _LAYERS[handle] = layer
    return handle


def _layer(handle: int) -> Any:
    layer = _LAYERS.get(handle)
    if layer is None:
        raise TorchCaffeError(
            "a compiled graph calls a convolution whose layer no longer exists",
            hint="compile the net again (torch._dynamo.reset())",
        )
    return layer


def _step(handles: list[int], sources: list[torch.Tensor]) -> Any:
    """What computes the top: the Convolution layer itself, or its fold with the links, once
    ``sources`` are seen to be those layers' own tensors."""
    layers = [_layer(h) for h in handles]
    producer = layers[0]
    step = producer
    if len(layers) > 1:
        key = tuple(handles)
        step = producer.graph_folds.get(key)
        if step is None:
            assert fold_builder is not None
            step = fold_builder(producer, {layer.caffe_type: layer for layer in layers[1:]})
            producer.graph_folds[key] = step
    mine = step.sources()
    # the graph hands the params themselves: identity first, storage only where it differs
    if len(mine) != len(sources) or any(
        a is not b and a.data_ptr() != b.data_ptr() for a, b in zip(mine, sources)
    ):
        if any(parametrize.is_parametrized(layer) for layer in layers):
            # a parametrized blob (torch.nn.utils.parametrize: weight_norm, ...) is computed
            # anew on each read, in the graph and here alike, from the same originals
            return step
        raise TorchCaffeError(
            "a compiled graph passes a convolution weights that are not its layers'",
            layer=producer.name,
            expected="the tensors the graph was traced with",
            got="other tensors",
            hint="compile the net again (torch._dynamo.reset())",
        )
    return step


def _channels_last(shape: tuple[Any, ...], like: torch.Tensor) -> torch.Tensor:
    return torch.empty(
        shape, dtype=like.dtype, device=like.device, memory_format=torch.channels_last
    )


def channels_last_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides ``torch.empty(shape, memory_format=torch.channels_last)`` has (N, C, H, W):
    computed rather than allocated on each call of the op."""
    _, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def _op() -> Any | None:
    """The custom op where this torch build can define one (torch >= 2.4), else None."""
    if not onednn_conv.available() or not onednn_linear.graph_ops_definable():
        return None

    @torch.library.custom_op("torchcaffe::cached_conv2d", mutates_args=())
    def cached_conv2d(
        x: torch.Tensor, sources: list[torch.Tensor], handles: list[int]
    ) -> torch.Tensor:
        step = _step(handles, sources)
        y = step.eager_top(x.contiguous(memory_format=torch.channels_last))
        if y.stride() != channels_last_strides(y.shape):  # the layout the graph was promised
            y = _channels_last(tuple(y.shape), y).copy_(y)
        return y

    @cached_conv2d.register_fake
    def _(x: torch.Tensor, sources: list[torch.Tensor], handles: list[int]) -> torch.Tensor:
        return _channels_last(tuple(_layer(handles[0]).top_shape(x)), x)

    return cached_conv2d


_CACHED_CONV2D = _op()


def wanted(spec: Spec, x: torch.Tensor, sources: list[torch.Tensor], group: int) -> bool:
    """Whether a compiled graph should call the op for a Convolution layer of geometry
    ``spec`` (its ``geom.spec``) and ``group``, which the caller read, over this bottom:
    under torch.compile but not torch.export, a dense 2-D convolution with at least
    MIN_WEIGHTS weights over more than one pixel, on CPU float32 tensors, with nothing
    recorded by autograd (the eager path then packs its weight; the op hands it a
    channels_last copy of an NCHW bottom). A pointwise (1x1) convolution only over a
    channels_last bottom: it gains by keeping the layout of a region of ops (ResNet-50 b1:
    1.02-1.06x the hand-written model without them, 1.21-1.29x with), and starting one costs
    more than it saves (MobileNetV2 b1: 0.86-0.90x, 0.95-0.96x without). Since the eager path
    packs pointwise weights too, taking every such convolution, or every one with at least
    2**14 weights, measured the same as this rule (MobileNetV2 b1, ResNet-50 b1 and b8:
    0.99-1.01x, median of per-round ratios)."""
    if _CACHED_CONV2D is None or not onednn_linear.graph_can_take([x, *sources]):
        return False
    if spec_layout(spec) != (1, 2) or x.dim() != 4:
        return False
    if x.shape[2] == x.shape[3] == 1:
        return False  # a classifier over pooled features: a GEMM with nothing to pack
    if group != 1 or sources[0].numel() < MIN_WEIGHTS:  # sources[0]: the weight
        return False
    if spec_is_pointwise(spec) and not onednn_conv.is_channels_last(x):
        return False  # it packs nothing; it pays only inside a channels_last region
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in [x, *sources]))


def call(x: torch.Tensor, sources: list[torch.Tensor], layers: list[Any]) -> torch.Tensor:
    """The op over bottom ``x`` for ``layers`` (a Convolution, then the links folded into it,
    whose tensors are ``sources``); the caller checked ``wanted``."""
    assert _CACHED_CONV2D is not None
    return _CACHED_CONV2D(x, sources, [layer.graph_handle for layer in layers])
