"""channels_last_layout: on CPU, 2-D convolutions and the layers between them run on
channels_last (NHWC) tensors where that is faster (inference only).

oneDNN reads and writes channels_last tensors as they are, its depthwise kernels are 2-4x
faster on them, and torch's pooling kernels vectorize over channels there. With the weight
packed once for oneDNN (``ops/onednn_conv``, which takes channels_last bottoms only) a dense
convolution is as fast or faster on channels_last at every size, so every 2-D convolution
gets a channels_last input. In-net, 2 threads, batch 1, median of 30 interleaved, against
the earlier rule below (both with packed weights): GoogLeNet 30.1 -> 26.4 ms, CaffeNet 17.8
-> 16.2, ResNet-50 54.4 -> 47.1, MobileNetV2 within 1%; batch 8 GoogLeNet and ResNet-50
1.5-2.4% faster.

Where the torch build has no packed convolution, the earlier rule holds: a dense convolution
over few positions (ResNet's 7x7 stage at batch 1) is up to 2.7x slower on channels_last
there, so it gets a channels_last input once that has MIN_PIXELS positions (N * H * W) at its
stride (N * ceil(H / sh) * ceil(W / sw)), decided per call. Counting at the stride keeps a
strided convolution into a small stage (ResNet-50's 28x28 -> 14x14 at batch 1) from handing
that stage a channels_last tensor which every later dense convolution there copies back and
every Eltwise adds to an NCHW one. MAX and AVE pooling always get channels_last too:
caffe_pool2d would convert to channels_last and back anyway; this way its top stays so. A
dense 1x1 convolution (stride 1, no pad) that is handed a channels_last input keeps it at any
size: ``conv2d`` runs it as one GEMM, where moving it to NCHW costs a copy and torch's
batch-1 NCHW kernel (im2col) is slower.

An RGB first layer counts as any other: oneDNN's kernel over its 3 channels is faster on a
channels_last copy of the input than on NCHW (GoogLeNet's 7x7/2 conv1 at batch 1, 2 threads,
1.9 -> 1.3 ms), and the layers after it then start channels_last. 2 threads, wall, median
of 9-15 interleaved, against skipping inputs of under 8 channels: GoogLeNet batch 8 196 ->
166 ms, batch 1 28.1 -> 27.8 ms; ResNet-50 batch 1 50.9 -> 49.6 ms, batch 8 385 -> 379 ms;
MobileNetV2 batch 8 91.1 -> 88.8 ms; CaffeNet within 2%.

The pass changes memory layout only, never values: each 2-D Convolution (or folded
Convolution) gets the wrapper; layer types whose kernels accept any strides and keep their
input's layout (LAYOUT_AGNOSTIC) pass such a tensor on; every other reader of a blob that
may be channels_last gets it back as a contiguous NCHW tensor first, so no layer sees a
layout it was not written for. ``TorchNet.forward`` hands back contiguous tensors. Tensors
off the CPU are left alone (no measurement says it helps there), and so are float64 ones:
oneDNN has no float64 kernels, and torch sends a channels_last float64 depthwise convolution
to a loop over its groups (MobileNetV2 at batch 1, 2 threads: 98 ms, against 47 ms in NCHW;
ResNet-50 103 -> 93 ms; the hand-written model: 43 and 98 ms). float16 keeps it: its dense
convolutions are oneDNN's in channels_last only (ResNet-50: 197 ms, against 1.6 s).

Under torch.compile the wrappers pass tensors through: inductor picks its own layouts, and a
conversion traced here is a real transposing copy that also blocks its fusions (GoogLeNet
batch 1, one thread: its pooling kernels took 2.2 ms each instead of 0.5 ms).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ...ops import onednn_conv
from ...proto import caffe_pb2
from ..program import LayerStep
from .program import OptimizedProgram, step_kind

PP = caffe_pb2.PoolingParameter

PASS_NAME = "channels_last_layout"
CHANNELS_LAST = torch.channels_last
# Without packed oneDNN weights, dense convolutions over fewer input positions (N * H * W, at
# their stride) than this, e.g. ResNet's 14x14 and 7x7 stages at batch 1, run up to 2.7x
# slower in channels_last on one thread.
MIN_PIXELS = 784
# Kernels that accept any strides and whose top keeps the bottom's memory format.
LAYOUT_AGNOSTIC = frozenset(
    {
        "ReLU",
        "ReLU+inplace",
        "Sigmoid",
        "TanH",
        "Dropout",
        "Split",
        "Concat",
        "Eltwise",
        "LRN",
        "BatchNorm+Scale",
        "BatchNorm+Scale+Bias",
        "BatchNorm+Bias",
    }
)


def _is_vectorized_pool(step_type: str, runner: Any) -> bool:
    """A MAX or AVE Pooling: torch's channels_last kernels are 10-25x faster than its NCHW ones
    (caffe_pool2d converts to channels_last anyway; given it, the top stays so)."""
    pool = getattr(runner, "pool", None)
    return step_type == "Pooling" and pool in (PP.MAX, PP.AVE)


def _conv2d_module(step: LayerStep, runner: Any) -> Any | None:
    """The 2-D Convolution layer (folded or not) over (N, C, H, W) that ``runner`` runs, else
    None."""
    if step_kind(step) != "Convolution":
        return None
    module = getattr(runner, "producer", None) or runner
    geom = getattr(module, "geom", None)
    if geom is None or geom.channel_axis != 1 or geom.num_spatial != 2:
        return None
    return module


def _is_pointwise(conv: Any) -> bool:
    """A dense 1x1 convolution (stride 1, no pad): ``conv2d`` runs it as one GEMM over a
    channels_last input at any size, so such an input may stay channels_last."""
    return conv.group == 1 and conv.geom.is_pointwise


class ChannelsLastInput:
    """Runs a layer on a channels_last copy of its (CPU) input where that is faster: always
    (``always``: depthwise convolutions, pooling), else once the input has MIN_PIXELS
    positions at ``stride`` (N * ceil(H / sh) * ceil(W / sw))."""

    __slots__ = ("runner", "always", "stride", "keep")

    def __init__(
        self,
        runner: Callable[..., Any],
        always: bool,
        stride: tuple[int, int] = (1, 1),
        keep: bool = False,
    ) -> None:
        self.runner = runner
        self.always = always
        self.stride = stride
        self.keep = keep

    @property
    def traced_runner(self) -> Callable[..., Any]:
        """What torch.compile runs: the layer (inductor picks the layouts), or what the
        runner it wraps has torch.compile run (``finite_pooling``'s wrapper)."""
        return getattr(self.runner, "traced_runner", self.runner)

    def __call__(self, *bottoms: torch.Tensor) -> Any:
        first = bottoms[0]
        if torch.compiler.is_compiling() or not first.is_cpu or first.dtype is torch.float64:
            return self.runner(*bottoms)
        return self.runner(*[self._layout(x) for x in bottoms])

    def _layout(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or not x.is_cpu:
            return x
        if self.keep and x.is_contiguous(memory_format=CHANNELS_LAST):
            return x
        sh, sw = self.stride
        if self.always or x.shape[0] * -(-x.shape[2] // sh) * -(-x.shape[3] // sw) >= MIN_PIXELS:
            return x.contiguous(memory_format=CHANNELS_LAST)
        return to_nchw(x)


class SharedTops:
    """Split without autograd: every top is the bottom itself.

    Split's ``view_as`` tops of a channels_last tensor with batch 1 get a batch stride that
    torch's format detection reads as NCHW, sending pooling and convolution to slow paths.
    """

    __slots__ = ("num_tops",)

    def __init__(self, num_tops: int) -> None:
        self.num_tops = num_tops

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x,) * self.num_tops


class ContiguousInput:
    """Runs a layer on NCHW-contiguous bottoms (a channels_last one is copied back)."""

    __slots__ = ("runner",)

    def __init__(self, runner: Callable[..., Any]) -> None:
        self.runner = runner

    def __call__(self, *bottoms: torch.Tensor) -> Any:
        return self.runner(*[to_nchw(x) for x in bottoms])


def to_nchw(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself unless it is a channels_last tensor that is not also NCHW-contiguous."""
    if x.dim() == 4 and onednn_conv.is_channels_last(x):
        return x.contiguous()
    return x


def channels_last_layout(program: OptimizedProgram, observable: frozenset[str]) -> OptimizedProgram:
    steps = program.steps
    new_steps = list(steps)
    runners: dict[str, Callable[..., Any]] = {}
    maybe_nhwc: set[str] = set()  # blobs whose current value may be channels_last
    moved = 0  # steps that get channels_last input
    for i, step in enumerate(steps):
        runner = program.runners[step.key]
        conv = _conv2d_module(step, runner)
        if conv is not None:
            key = f"{step.key}+nhwc"
            depthwise = conv.group == conv.channels and conv.group > 1
            stride = (conv.geom.stride[0], conv.geom.stride[1])
            keep = _is_pointwise(conv)
            always = depthwise or onednn_conv.available()
            runners[key] = ChannelsLastInput(runner, always=always, stride=stride, keep=keep)
            new_steps[i] = dataclasses.replace(step, key=key)
            maybe_nhwc.update(step.tops)
            moved += 1
        elif _is_vectorized_pool(step.type, runner):
            key = f"{step.key}+nhwc"
            runners[key] = ChannelsLastInput(runner, always=True)
            new_steps[i] = dataclasses.replace(step, key=key)
            maybe_nhwc.update(step.tops)
            moved += 1
        elif step.type in LAYOUT_AGNOSTIC:
            if maybe_nhwc.intersection(step.bottoms):
                maybe_nhwc.update(step.tops)
                if step.type == "Split":
                    key = f"{step.key}+shared"
                    runners[key] = SharedTops(len(step.tops))
                    new_steps[i] = dataclasses.replace(step, key=key)
            else:
                maybe_nhwc.difference_update(step.tops)
        elif maybe_nhwc.intersection(step.bottoms):
            key = f"{step.key}+nchw"
            runners[key] = ContiguousInput(runner)
            new_steps[i] = dataclasses.replace(step, key=key)
            maybe_nhwc.difference_update(step.tops)
        else:
            maybe_nhwc.difference_update(step.tops)
    if not any(_conv2d_module(s, program.runners[s.key]) for s in steps):
        return program.rewritten(PASS_NAME, list(steps), {}, 0)
    return program.rewritten(PASS_NAME, new_steps, runners, moved)
