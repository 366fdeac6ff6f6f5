"""Convolution: N-d grouped, dilated convolution over the axes after ``axis``."""

from __future__ import annotations

import abc
import math
from typing import Any

import torch
import torch.nn.functional as F

from ..registry import register_layer
from . import frozen_graph, fused_relu, onednn_conv, onednn_linear, opaque_conv, small_bottom_conv
from ._conv_geometry import ConvGeometry, conv_geometry, im2col_nd
from .base import AtLeast, CaffeLayer
from .onednn_conv import PackedConvWeight


class ConvolutionBase(CaffeLayer, metaclass=abc.ABCMeta):
    """Shared by Convolution and Deconvolution (Caffe's BaseConvolutionLayer).

    Several bottoms are convolved with the same filters, one top each; they must share a shape.
    Leading axes before ``axis`` are independent inputs (flattened into one batch axis).
    """

    param_field = "convolution_param"
    bottoms = AtLeast(1)
    tops = AtLeast(1)
    equal_bottom_top = True
    reverse_dimensions = False  # Deconvolution: filters map num_output -> channels

    # param blobs, registered by add_blob
    weight: torch.Tensor
    bias: torch.Tensor

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        shape = self.bottom_shapes[0]
        self.geom, self.num_output, self.group = self.setup_geometry(shape)
        self.channels = shape[self.geom.channel_axis]
        self.bias_term = p.bias_term
        self.weight_cache = PackedConvWeight()
        for i, other in enumerate(self.bottom_shapes[1:], 1):
            if other != shape:
                raise self.error(
                    f"all bottoms must have the same shape; bottom {i} differs",
                    expected=shape,
                    got=other,
                )
        conv_out, conv_in = self.num_output, self.channels
        if self.reverse_dimensions:
            conv_out, conv_in = conv_in, conv_out
        self.add_blob(
            "weight", (conv_out, conv_in // self.group, *self.geom.kernel), filler=p.weight_filler
        )
        if self.bias_term:
            self.add_blob("bias", (self.num_output,), filler=p.bias_filler)
        self.top_spatial(shape[self.geom.channel_axis + 1 :])

    def setup_geometry(self, shape) -> tuple[ConvGeometry, int, int]:
        p = self.param
        geom = conv_geometry(self, p, shape)
        channels = shape[geom.channel_axis]
        if p.num_output <= 0:
            raise self.error("num_output must be positive", expected="> 0", got=p.num_output)
        if p.group <= 0 or channels % p.group:
            raise self.error(
                "group must divide the number of input channels",
                expected=f"a divisor of {channels}",
                got=f"group {p.group}",
            )
        if p.num_output % p.group:
            raise self.error(
                "num_output must be a multiple of group",
                expected=f"a multiple of {p.group}",
                got=p.num_output,
            )
        return geom, p.num_output, p.group

    def output_spatial(self, spatial) -> tuple[int, ...]:
        return self.geom.conv_output(spatial)

    def top_spatial(self, spatial) -> tuple[int, ...]:
        out = self.output_spatial(spatial)
        if any(o <= 0 for o in out):
            raise self.error(
                "output size is not positive for this bottom",
                expected="every output dim > 0",
                got=f"{tuple(out)} from spatial {tuple(spatial)}",
            )
        return out

    def output_shapes(self, bottom_shapes):
        """Caffe's Reshape checks, once per input shape (``forward`` repeats none of them)."""
        axis = self.geom.channel_axis
        shape0 = tuple(int(d) for d in bottom_shapes[0])
        tops = []
        for shape in bottom_shapes:
            shape = tuple(int(d) for d in shape)
            if len(shape) != axis + 1 + self.geom.num_spatial or shape[axis] != self.channels:
                raise self.error(
                    "bottom incompatible with the convolution set up",
                    expected=f"{axis + 1 + self.geom.num_spatial} axes with "
                    f"{self.channels} channels at axis {axis}",
                    got=shape,
                )
            if shape != shape0:
                raise self.error("all bottoms must have the same shape", expected=shape0, got=shape)
            tops.append((*shape[:axis], self.num_output, *self.top_spatial(shape[axis + 1 :])))
        return tops

    def forward(self, *bottoms: torch.Tensor):
        if len(bottoms) == 1:
            return self._one(bottoms[0])
        return tuple(self._one(x) for x in bottoms)

    def _one(self, x: torch.Tensor) -> torch.Tensor:
        axis, n = self.geom.layout()
        if axis == 1 and x.dim() == 2 + n:
            return self.compute(x, tuple(x.shape[2:]))
        lead, spatial = x.shape[:axis], tuple(x.shape[axis + 1 :])
        y = self.compute(x.reshape(math.prod(lead), self.channels, *spatial), spatial)
        return y.reshape(*lead, self.num_output, *y.shape[2:])

    @abc.abstractmethod
    def compute(self, x: torch.Tensor, spatial: tuple[int, ...]) -> torch.Tensor:
        """The convolution proper over (N, C, *spatial) input."""

    def add_bias(self, y: torch.Tensor) -> torch.Tensor:
        if not self.bias_term:
            return y
        return y + self.bias.view(-1, *([1] * (y.dim() - 2)))


def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: tuple[int, ...],
    pad: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
    weight_cache: PackedConvWeight | None = None,
    relu: fused_relu.Slope = None,
) -> torch.Tensor:
    """``F.conv2d``, then the ReLU of slope ``relu`` if any (``fused_relu``), on oneDNN with
    the weight packed once into ``weight_cache`` where it can take the call
    (``onednn_conv``). A dense 1x1 convolution (stride 1, no pad) is one GEMM instead:

    - over a 1x1 bottom (MobileNetV2's classifier), in any layout: torch sends it to its
      im2col kernel, 0.41 ms in-net for 1280 -> 1000 at batch 1;
    - over a channels_last bottom where the packed weight cannot serve (no cache, autograd
      recording), in eager mode: the (N*H*W, C) matrix is a free view and the product
      channels_last too. Where it can, the packed convolution is faster than the GEMM on
      oneDNN's plain weight (2 threads, in-net, median of per-round ratios: ResNet-50 1.08x
      at batch 1, 1.05x at batch 8; MobileNetV2 1.06x / 1.04x; GoogLeNet 1.04x / 1.03x).
      A traced graph gets ``F.conv2d``: over a channels_last input (inductor, 2 threads,
      batch 1) it ran MobileNetV2 in 16.5 ms against 27.3 ms for the view, product and view
      back, ResNet-50 in 47 against 50 ms; and those views broke inductor (torch 2.13) on
      GoogLeNet: a static graph's fused convolution after them failed its stride assertion,
      and a dynamic graph's lowering raised ``ValueRangeError``.

    In a compiled graph, a batch-1 convolution that aten would send to its im2col kernel,
    with enough work for oneDNN to be faster, runs there (``small_bottom_conv``).

    A graph whose params inductor freezes gets ``F.conv2d`` (``frozen_graph``): inductor
    packs its weight for oneDNN, where it sends a GEMM to MKL, whose batch-1 product runs
    on one thread (MobileNetV2's classifier: 0.40 ms a call).
    """
    if weight_cache is not None and x.is_cpu and not torch.compiler.is_compiling():
        # the call this cache made last, made again (not read in a trace: a guard on it)
        y = weight_cache.replay(x, weight, bias, (stride, pad, dilation, groups), relu)
        if y is not None:
            return y
    if not x.is_cpu or frozen_graph.params_frozen():  # the forms below are the CPU's
        return fused_relu.apply_(F.conv2d(x, weight, bias, stride, pad, dilation, groups), relu)
    pointwise = (
        weight.shape[2:] == (1, 1) and groups == 1 and all(v == 1 for v in stride) and not any(pad)
    )
    if pointwise and x.shape[2] == x.shape[3] == 1:  # a classifier over pooled features
        flat = x.reshape(x.shape[0], x.shape[1])  # (no -1: a batch of 0 infers no size)
        y = onednn_linear.pixel_rows_product(flat, weight.flatten(1), bias, relu)
        return y.reshape(*y.shape, 1, 1)
    can_pack = weight_cache is not None and onednn_conv.can_take(x, weight, bias)
    packed = weight_cache if can_pack else None
    if (
        pointwise
        and packed is None
        and onednn_conv.is_channels_last(x)
        and not torch.compiler.is_compiling()
    ):
        n, c, h, w = x.shape
        rows = x.permute(0, 2, 3, 1).reshape(n * h * w, c)
        y = onednn_linear.pixel_rows_product(rows, weight.reshape(weight.shape[0], c), bias, relu)
        return y.reshape(n, h, w, -1).permute(0, 3, 1, 2)
    geometry = (stride, pad, dilation, groups)
    if packed is not None:
        return packed.conv2d(x, weight, bias, geometry, relu)
    if small_bottom_conv.wanted(x, weight, bias, geometry):
        return fused_relu.apply_(small_bottom_conv.conv2d(x, weight, bias, geometry), relu)
    return fused_relu.apply_(F.conv2d(x, weight, bias, stride, pad, dilation, groups), relu)


@register_layer("Convolution")
class ConvolutionLayer(ConvolutionBase):
    """Cross-correlation with learned filters. Caffe type ``Convolution``, ``convolution_param``.

    Output: (in + 2 * pad - (dilation * (kernel - 1) + 1)) / stride + 1 per spatial axis, with
    C's truncating division. Weight blob (num_output, channels / group, *kernel), bias
    (num_output,). ``force_nd_im2col`` and ``engine`` have no numeric effect.
    Differs from torch: when in + 2 * pad < extent, C's division still gives one output (the
    window reads zeros past the end); any number of spatial axes (>3 via im2col).
    """

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        # this convolution with a chain folded in, as a compiled graph's opaque op runs it
        # (``opaque_conv``), by the handles of the chain's layers
        self.graph_folds: dict[tuple[int, ...], Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        """The state less ``graph_folds``, a cache (of slotted folds, which pickle only at
        protocol 2 and up) keyed by handles that a copy does not share."""
        state: dict[str, Any] = super().__getstate__()
        state["graph_folds"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.graph_folds = {}  # keyed by the original's handles (a pickle from before)

    def sources(self) -> list[torch.Tensor]:
        """The tensors the top derives from besides the bottom (``opaque_conv``)."""
        return [self.weight, self.bias] if self.bias_term else [self.weight]

    def top_shape(self, x: torch.Tensor) -> tuple[Any, ...]:
        return (x.shape[0], self.num_output, *self.top_spatial(tuple(x.shape[2:])))

    def eager_top(self, x: torch.Tensor) -> torch.Tensor:
        return self.compute(x, tuple(x.shape[2:]))

    def top_with_relu(self, x: torch.Tensor, slope: fused_relu.Slope) -> torch.Tensor:
        """The top of one (N, C, *spatial) bottom with a ReLU of ``slope`` fused in
        (``fused_relu``; inference only)."""
        axis, n = self.geom.layout()
        if axis != 1 or x.dim() != 2 + n:
            return fused_relu.apply_(self._one(x), slope)
        if n == 2 and x.is_cpu and not torch.compiler.is_compiling():
            # the packed call made last, before ``compute``'s own checks (a bottom of the
            # shape that call had needs no extra pad)
            bias = self.bias if self.bias_term else None
            geometry = (*self.geom.torch_args(), self.group)
            y = self.weight_cache.replay(x, self.weight, bias, geometry, slope)
            if y is not None:
                return y
        return self.compute(x, tuple(x.shape[2:]), relu=slope)

    def compute(
        self, x: torch.Tensor, spatial: tuple[int, ...], relu: fused_relu.Slope = None
    ) -> torch.Tensor:
        """The convolution proper, then the ReLU of slope ``relu`` if any (``fused_relu``)."""
        g, n = self.geom, self.geom.num_spatial
        compiling = torch.compiler.is_compiling()
        if compiling and opaque_conv.wanted(g.spec, x, self.sources(), self.group):
            return fused_relu.apply_(opaque_conv.call(x, self.sources(), [self]), relu)
        weight = self.weight
        if n == 0:  # no spatial axes: a 1x1 convolution over a length-1 axis
            y = F.conv1d(x.unsqueeze(-1), weight.unsqueeze(-1), groups=self.group)
            return fused_relu.apply_(self.add_bias(y.squeeze(-1)), relu)
        if n > 3:
            cols = im2col_nd(x, g)
            out = cols.shape[2:]
            cols = cols.reshape(x.shape[0], self.group, -1, math.prod(out))
            w = weight.reshape(self.group, self.num_output // self.group, -1)
            y = torch.einsum("gok,ngkl->ngol", w, cols)
            y = self.add_bias(y.reshape(x.shape[0], self.num_output, *out))
            return fused_relu.apply_(y, relu)
        extra = g.extra_pad(spatial)
        if any(extra):
            x = F.pad(x, [v for e in reversed(extra) for v in (0, e)])
        bias = self.bias if self.bias_term else None
        stride, pad, dilation = g.torch_args()
        if n == 2:
            cache = self.weight_cache
            return conv2d(x, weight, bias, stride, pad, dilation, self.group, cache, relu)
        conv = F.conv1d if n == 1 else F.conv3d
        y = conv(x, weight, bias, stride, pad, dilation, self.group)
        return fused_relu.apply_(y, relu)
