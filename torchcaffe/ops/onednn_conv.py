"""A 2-D convolution's inference on oneDNN with its weight packed once (``PackedConvWeight``).

``F.conv2d`` hands oneDNN a plain (NCHW or channels_last) weight, which oneDNN reorders into
its blocked layout on every call; and at batch 1 torch sends a small input (under 20480
values, as GoogLeNet's 7x7 and 14x14 3x3 convolutions) to its im2col kernel instead. Packing
the weight once for the input shape (``mkldnn_reorder_conv2d_weight``, as inductor's freezing
does) and running oneDNN's convolution (``mkldnn::_convolution_pointwise``) on it skips both.
Measured alone, 2 threads, median of 31, us plain -> packed over a channels_last input:
3x3 512 -> 512 over 7x7 at batch 1 2447 -> 1065 (NCHW input, torch's kernel: 1870); 3x3
256 -> 384 over 13x13 (CaffeNet's conv3) 1736 -> 1395; 3x3 192 -> 384 over 7x7 (GoogLeNet)
560 -> 335; depthwise 3x3 over 28x28x384 148 -> 121; batch 8, 56x56 64 -> 64 8738 -> 8666.
The values are those of torch's oneDNN path (the same kernels).

The packed copy doubles the weight's memory, as the channels_last copy it replaces did (a 1x1
convolution, a GEMM over the plain weight before, adds it: ResNet-50's inference RSS 654 ->
719 MB, 97 MB of params, for 1.05-1.08x), and follows the weight: it is made again when the
weight's version, storage or the input shape changes (one shape is kept: a net that
alternates shapes packs each time). Any call oneDNN cannot take as it is (not a CPU float32
tensor, autograd recording, torch.compile or torch.jit's tracer, ``torch.backends.mkldnn``
off) runs ``F.conv2d``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from . import data_watch, fused_relu
from ._transforms import under_func_transform


def _onednn_ops() -> tuple[Any, Any] | None:
    """(weight packing, convolution) where this torch build has them, else None."""
    if not torch.backends.mkldnn.is_available():
        return None
    conv = getattr(torch.ops.mkldnn, "_convolution_pointwise", None)
    pack = getattr(torch._C._nn, "mkldnn_reorder_conv2d_weight", None)
    return None if conv is None or pack is None else (pack, conv)


_OPS = _onednn_ops()


def available() -> bool:
    """Does this torch build have oneDNN's packed convolution (else ``conv2d`` is F.conv2d)?"""
    return _OPS is not None


def pointwise_op() -> Any | None:
    """oneDNN's convolution op (``mkldnn::_convolution_pointwise``) where ``available``, else
    None (``small_bottom_conv`` calls it over plain weights)."""
    return None if _OPS is None else _OPS[1]


def is_channels_last(x: torch.Tensor) -> bool:
    """Laid out channels_last and not also NCHW-contiguous (as a tensor with 1x1 spatial
    size or one channel is both). Never under a torch.func transform, whose tensors answer no
    memory-format query (the layout pass hands them none)."""
    if x.is_contiguous() or under_func_transform():
        return False
    return x.is_contiguous(memory_format=torch.channels_last)


def can_take(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether oneDNN can run this convolution as it is: a channels_last bottom (the layout
    pass hands every 2-D convolution one on the CPU) and nothing recorded by autograd."""
    if _OPS is None or not torch.backends.mkldnn.enabled:
        return False
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False  # first: the checks below are not all traceable
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if not all(t.is_cpu and t.dtype == torch.float32 and not t.is_mkldnn for t in tensors):
        return False
    if not is_channels_last(x):
        return False  # oneDNN's top is channels_last: the bottom must be, so layouts stay put
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    if torch.is_autocast_enabled("cpu"):
        return False  # oneDNN's op is no autocast op: F.conv2d runs in the autocast dtype
    # made under inference_mode: no version counter to key the copy on
    return not weight.is_inference()


# (stride, pad, dilation, groups) of a 2-D convolution
Geometry = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]


class PackedConvWeight:
    """A convolution weight packed into oneDNN's layout for one input shape, kept until the
    weight or the shape changes (``conv2d`` runs on it).

    The call made last is kept whole, so that the next call with the same weight, bias,
    geometry and input layout makes it again (``replay``) without ``can_take``'s and the
    packing key's checks (with the fold's cheaper source lookup, in-net, 2 threads, batch 1,
    median of 61 per-round ratios: MobileNetV2 1.06x, GoogLeNet 1.03x, ResNet-50 1.02x;
    MobileNetV2 batch 8 1.01x).
    """

    def __init__(self) -> None:
        # the last packed call, as one attribute: two threads running the net read a
        # consistent one
        self._entry: _PackedCall | None = None

    def conv2d(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        geometry: Geometry,
        relu: fused_relu.Slope = None,
    ) -> torch.Tensor:
        """``F.conv2d(x, weight, bias, *geometry)`` on the packed weight (``geometry``: stride,
        pad, dilation, groups), channels_last as the bottom, then the ReLU of slope ``relu``
        if any (``fused_relu``). The caller checked ``can_take``."""
        entry = self._entry
        if entry is None or not entry.packs(weight, tuple(x.shape), geometry):
            entry = _PackedCall.pack(weight, x, geometry)
        entry = self._entry = entry.with_call(x, bias)
        return entry.run(x, bias, relu)

    def replay(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        geometry: Geometry,
        relu: fused_relu.Slope = None,
    ) -> torch.Tensor | None:
        """``conv2d``'s value when this is the call it made last (the same weight, unchanged,
        the same bias, geometry, input shape and strides, oneDNN still on, nothing recorded
        by autograd or traced by torch.jit), else None: the caller runs ``conv2d``'s checks
        then. Never called under torch.compile (the caller checks)."""
        entry = self._entry
        if entry is None or not entry.replays(x, weight, bias, geometry):
            return None
        return entry.run(x, bias, relu)

    def forget(self) -> None:
        """Drop the packed copy: the weight was written where its version does not show it."""
        self._entry = None

    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy`` of the net, pickling) starts without the packed weight,
        which it packs again on its first call: oneDNN's opaque tensor has no storage to copy."""
        return {"_entry": None}


class _PackedCall:
    """A weight packed for one input shape and geometry, and the call last made on it: the
    input's strides and dtype, and the bias (read by oneDNN on each call, so only its
    identity and storage are kept)."""

    __slots__ = ("weight", "weight_key", "shape", "geometry", "packed", "args", "call")

    weight: weakref.ref[torch.Tensor]

    def __init__(
        self,
        weight: torch.Tensor,
        shape: tuple[int, ...],
        geometry: Geometry,
        packed: torch.Tensor,
        call: tuple[Any, ...] = (),
    ) -> None:
        # weakly: a weight replaced (a fold after an optimizer step) is not kept alive by an
        # entry that waits for the layer's next inference call
        self.weight = weakref.ref(weight)
        self.weight_key = (weight._version, weight.data_ptr(), data_watch.touches)
        self.shape = shape
        self.geometry = geometry
        self.packed = packed
        stride, pad, dilation, groups = geometry
        self.args = (list(pad), list(stride), list(dilation), groups)
        # (input strides, bias, bias storage) of the last call; empty until one is made
        self.call = call

    @classmethod
    def pack(cls, weight: torch.Tensor, x: torch.Tensor, geometry: Geometry) -> _PackedCall:
        assert _OPS is not None
        pack = _OPS[0]
        stride, pad, dilation, groups = geometry
        plain = weight.detach().contiguous().to_mkldnn()
        packed = pack(plain, list(pad), list(stride), list(dilation), groups, list(x.shape))
        return cls(weight, tuple(x.shape), geometry, packed)

    def packs(self, weight: torch.Tensor, shape: Sequence[int], geometry: Geometry) -> bool:
        """Was this packed from ``weight`` as it is now, for this input shape and geometry?"""
        return (
            weight is self.weight()
            and (weight._version, weight.data_ptr(), data_watch.touches) == self.weight_key
            and shape == self.shape
            and geometry == self.geometry
        )

    def with_call(self, x: torch.Tensor, bias: torch.Tensor | None) -> _PackedCall:
        """This packing, with the call over ``x`` and ``bias`` as the one to replay."""
        call = (x.stride(), bias, None if bias is None else bias.data_ptr())
        last = self.call
        if last and last[1] is bias and last[0] == call[0] and last[2] == call[2]:
            return self
        weight = self.weight()
        assert weight is not None  # the caller holds it
        return _PackedCall(weight, self.shape, self.geometry, self.packed, call)

    def replays(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        geometry: Geometry,
    ) -> bool:
        """Would ``can_take`` pass, and this packing serve, a call like the last one? (A GPU's
        call, bound by host work, is answered first.)"""
        if not x.is_cpu or not self.call or not torch._C._get_mkldnn_enabled():
            return False
        if torch.is_grad_enabled() and (
            x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        ):
            return False  # autograd records the call (a frozen net with grad on does not)
        if torch._C._is_tracing():  # torch.jit's (the caller is not run by dynamo)
            return False
        if torch.is_autocast_enabled("cpu"):  # as can_take
            return False
        strides, last_bias, bias_storage = self.call
        return (
            bias is last_bias
            and (bias is None or bias.data_ptr() == bias_storage)
            and x.is_cpu
            and x.dtype is torch.float32
            and not x.is_mkldnn
            and x.stride() == strides
            and self.packs(weight, x.shape, geometry)
        )

    def run(
        self, x: torch.Tensor, bias: torch.Tensor | None, relu: fused_relu.Slope
    ) -> torch.Tensor:
        assert _OPS is not None
        pad, stride, dilation, groups = self.args
        return fused_relu.onednn_call(
            _OPS[1], relu, x, self.packed, bias, pad, stride, dilation, groups
        )
