"""Pooling: 2-D MAX / AVE / STOCHASTIC pooling with Caffe's window and output-size rules."""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import TorchCaffeError
from ..proto import caffe_pb2
from ..registry import register_layer
from ._transforms import under_func_transform, with_jvp
from .base import Between, CaffeLayer

PP = caffe_pb2.PoolingParameter
FLT_MAX = 3.4028234663852886e38  # Caffe starts every MAX window at -FLT_MAX
# Inductor before torch 2.13 miscompiles _FlooredMaxPool2d's backward where the bottom has
# other consumers (torch 2.11: a global MAX pool beside a convolution and another layer got
# the bottom's gradient 0.16 off); compiled on such a torch, autograd's own path is taken.
COMPILED_FLOORED_POOL = torch.torch_version.TorchVersion(torch.__version__) >= "2.13"
Pair = tuple[int, int]


def pooled_size(size: int, kernel: int, stride: int, pad: int, ceil: bool, clip: bool) -> int:
    """Caffe: ceil/floor((size + 2 * pad - kernel) / stride) + 1, in float; with ``clip`` (any
    pad on either axis) the last window is dropped when it would start in the padding."""
    q = (size + 2 * pad - kernel) / stride
    out = (math.ceil(q) if ceil else math.floor(q)) + 1
    if clip and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _torch_ceil_mode(hw: Pair, kernel: Pair, stride: Pair, pad: Pair, out: Pair) -> bool | None:
    """torch's pooling ceil_mode flag that yields Caffe's output size on both axes, or None
    when torch cannot express the geometry (pad > kernel / 2, or different rounding)."""
    if any(2 * p > k for p, k in zip(pad, kernel)):
        return None
    for ceil in (False, True):
        sizes = []
        for i, k, s, p in zip(hw, kernel, stride, pad):
            o = (i + 2 * p - k + (s - 1 if ceil else 0)) // s + 1
            if ceil and (o - 1) * s >= i + p:
                o -= 1
            sizes.append(o)
        if tuple(sizes) == tuple(out):
            return ceil
    return None


def _explicit_pad(hw: Pair, kernel: Pair, stride: Pair, pad: Pair, out: Pair) -> list[int]:
    """F.pad widths (left, right, top, bottom) after which an unpadded floor-mode pooling has
    exactly Caffe's windows (negative widths crop)."""
    (h, w), (kh, kw), (sh, sw), (ph, pw), (oh, ow) = hw, kernel, stride, pad, out
    return [pw, (ow - 1) * sw + kw - w - pw, ph, (oh - 1) * sh + kh - h - ph]


def _floor_at_flt_max(x: torch.Tensor) -> torch.Tensor:
    """NaN and values <= -FLT_MAX become -FLT_MAX: Caffe starts each MAX window there and
    compares with a strict >, so they never win. One nan_to_num pass where no gradient flows;
    under autograd a where (``_FlooredMaxPool2d`` replaces it where torch's own padding
    serves). Under torch.compile always the where: inductor fuses it into the pooling's loads
    as a vector compare, where nan_to_num's isnan became a scalar loop per load. Under a
    torch.func transform the where, too, whose derivative every transform knows."""
    if _recorded(x) or torch.compiler.is_compiling() or under_func_transform():
        return torch.where(x > -FLT_MAX, x, -FLT_MAX)
    return torch.nan_to_num(x, nan=-FLT_MAX, posinf=math.inf, neginf=-FLT_MAX)


class _FlooredMaxPool2d(torch.autograd.Function):
    """MAX pooling of the floored bottom (``_floor_at_flt_max``) -> (top, indices), whose
    backward sends each window's gradient to its winner unless the window's best was floored,
    as Caffe's mask does. Values and gradients are those of pooling ``where(x > -FLT_MAX, x,
    -FLT_MAX)`` under autograd, but the backward reads the saved indices and the top instead
    of a mask over the whole bottom. Compiled fwd+bwd of a 3x3/2 pool after a ReLU over
    8x192x56x56, one thread: 64 -> 38 ms (torch's pooling without the floor: 30 ms)."""

    @staticmethod
    def forward(ctx, x, kernel, stride, pad, ceil):  # type: ignore[override]
        floored = _floor_at_flt_max(x)  # autograd records nothing here: one nan_to_num
        y, idx = torch.ops.aten.max_pool2d_with_indices(floored, kernel, stride, pad, 1, ceil)
        ctx.save_for_backward(y, idx)
        ctx.save_for_forward(y, idx)
        # the bottom's layout, not the bottom: its values are not needed, and saving it would
        # refuse a backward after a later in-place write, which the where's autograd allowed
        ctx.bottom = (x.shape, x.stride(), x.dtype, x.device)
        ctx.geometry = (kernel, stride, pad, ceil)
        ctx.mark_non_differentiable(idx)
        # the indices take no gradient: autograd would otherwise fill a zero tensor of their
        # shape for each backward (a kernel and an int64 allocation per pooling)
        ctx.set_materialize_grads(False)
        return y, idx

    @staticmethod
    def backward(ctx, grad_y, grad_idx):  # type: ignore[override]
        if grad_y is None:
            return None, None, None, None, None
        y, idx = ctx.saved_tensors
        shape, strides, dtype, device = ctx.bottom
        like = torch.empty_strided(shape, strides, dtype=dtype, device=device)
        kernel, stride, pad, ceil = ctx.geometry
        # a floored best (the top holds no NaN): Caffe's mask is -1, so no gradient. ReLU's
        # backward op zeroes where y <= -FLT_MAX in one pass: a compare and a masked_fill
        # were two kernels with a bool top between, and 6.8x its time on the CPU
        # (8x192x28x28, 2 threads: 2.5 ms against 0.37)
        grad_y = torch.ops.aten.threshold_backward(grad_y, y, -FLT_MAX)
        grad_x = torch.ops.aten.max_pool2d_with_indices_backward(
            grad_y, like, kernel, stride, pad, 1, ceil, idx
        )
        return grad_x, None, None, None, None

    @staticmethod
    def tangent(ctx, x_t, *_):
        """(torch.autograd.forward_ad) Each window's winner's tangent, 0 where the window's
        best was floored: the backward's transpose."""
        y, idx = ctx.saved_tensors
        n, c = y.shape[:2]
        y_t = x_t.reshape(n, c, -1).gather(2, idx.reshape(n, c, -1)).reshape(y.shape)
        return torch.ops.aten.threshold_backward(y_t, y, -FLT_MAX), None


def _recorded(x: torch.Tensor) -> bool:
    """Whether autograd records an op on ``x`` (a training forward); under torch.jit's tracer
    always: its graph must be one that can run backward, the same with or without autograd
    (the trace's own check runs under ``no_grad``)."""
    return (x.requires_grad and torch.is_grad_enabled()) or torch.jit.is_tracing()


def _max_pool(x, kernel, stride, pad, out, want_mask, finite=False):
    """Caffe's MAX pooling. On the CPU (no sync to pay) the bottom is pooled as it is first:
    torch's max pooling lets NaN win, so a top whose minimum is > -FLT_MAX (a NaN minimum
    fails the compare) had no NaN in any window and no window whose best is floored: it is
    Caffe's, and the floor pass (and under autograd its backward) is skipped. The check reads
    the top once (``amin``; a compare-and-``all`` took 8-18x longer): LeNet's pool1 at batch
    64, forward + backward, one thread, 6.07 -> 5.56 ms with the compare; in inference,
    where the floor always ran before, GoogLeNet at two threads 29.5 -> 28.5 ms at batch 1
    and 257 -> 239 ms at batch 8 (median of 15, interleaved). Where the floor is needed, or
    under torch.compile, autograd records ``_FlooredMaxPool2d`` where torch's padding serves.
    ``finite``: the caller knows the bottom holds no NaN or infinity (``finite_pooling``), so
    the top has the values Caffe's has (a window of -FLT_MAX alone gives -FLT_MAX on either
    side, and ``_mask`` -1) and the check is skipped: 1.03x on GoogLeNet at batch 1, in-net,
    2 threads. Under a torch.func transform the floor always runs (no branch on a value),
    without ``_FlooredMaxPool2d`` (autograd records the where)."""
    transformed = under_func_transform()
    # not in a jit trace: it would keep the example's answer, and a NaN in a later input
    # would win its window
    traced = torch.compiler.is_compiling() or torch.jit.is_tracing()
    if x.is_cpu and not traced and not transformed:
        y, mask = _max_pool_windows(x, kernel, stride, pad, out, want_mask)
        if finite or y.numel() == 0 or bool(y.amin() > -FLT_MAX):
            return y, mask
    ceil = _torch_ceil_mode((x.shape[2], x.shape[3]), kernel, stride, pad, out)
    if (
        ceil is not None
        and _recorded(x)
        and (COMPILED_FLOORED_POOL or not torch.compiler.is_compiling())
        and not torch.jit.is_tracing()  # a Python op: no TorchScript or ONNX form
        and not transformed
    ):
        y, idx = with_jvp(_FlooredMaxPool2d).apply(x, kernel, stride, pad, ceil)
        return y, (_mask(y, idx) if want_mask else None)
    return _max_pool_windows(_floor_at_flt_max(x), kernel, stride, pad, out, want_mask)


def torch_max_pool(x: torch.Tensor, kernel: Pair, stride: Pair, pad: Pair, ceil: bool):
    """Caffe's one-top MAX pooling where torch's own flags give its windows
    (``PoolingLayer.torch_pool_args``), as ``_max_pool`` computes it off the CPU outside a
    trace: ``_FlooredMaxPool2d`` where autograd records, else torch's pooling of the floored
    bottom."""
    if _recorded(x) and not under_func_transform():
        return with_jvp(_FlooredMaxPool2d).apply(x, kernel, stride, pad, ceil)[0]
    return torch.max_pool2d(_floor_at_flt_max(x), kernel, stride, pad, 1, ceil)


def _max_pool_windows(x, kernel, stride, pad, out, want_mask):
    hw = (x.shape[2], x.shape[3])
    ceil = _torch_ceil_mode(hw, kernel, stride, pad, out)
    if ceil is not None:
        pooled = F.max_pool2d(x, kernel, stride, pad, ceil_mode=ceil, return_indices=want_mask)
        y, idx = pooled if want_mask else (pooled, None)
    else:
        widths = _explicit_pad(hw, kernel, stride, pad, out)
        xp = F.pad(x, widths, value=-math.inf)
        y, idx = F.max_pool2d(xp, kernel, stride, return_indices=True)
        wp = xp.shape[3]
        idx = (idx // wp - widths[2]) * hw[1] + (idx % wp - widths[0])
        y = y.clamp_min(-FLT_MAX)  # windows entirely in the padding
    if not want_mask:
        return y, None
    assert idx is not None
    return y, _mask(y, idx)


def _mask(y: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Caffe's mask top: each window's winner as a flat h * W + w, -1 where none beat
    -FLT_MAX."""
    return torch.where(y > -FLT_MAX, idx.to(y.dtype), -1.0)


def _overhangs(hw: Pair, kernel: Pair, stride: Pair, pad: Pair, out: Pair) -> bool:
    """Does the last window on some axis reach past size + pad (a ceil-mode output)?"""
    return any((o - 1) * s - p + k > i + p for i, k, s, p, o in zip(hw, kernel, stride, pad, out))


def _ave_pool(x, kernel, stride, pad, out):
    hw = (x.shape[2], x.shape[3])
    ceil = _torch_ceil_mode(hw, kernel, stride, pad, out)
    # inductor's backward of avg_pool2d gets the divisor of a window reaching past size + pad
    # wrong (torch 2.13: up to 0.75 off on a 5x5 input, 2x2/2); the explicit sums compile right
    compiled_overhang = (
        ceil
        and _recorded(x)
        and torch.compiler.is_compiling()
        and _overhangs(hw, kernel, stride, pad, out)
    )
    if ceil is not None and not compiled_overhang:
        # torch's count_include_pad divisor is Caffe's pool_size
        return F.avg_pool2d(x, kernel, stride, pad, ceil_mode=ceil, count_include_pad=True)
    padded = F.pad(x, _explicit_pad(hw, kernel, stride, pad, out))
    if _onnx_exporting():  # both torch.onnx exporters drop divisor_override: an average
        sums = F.avg_pool2d(padded, kernel, stride) * (kernel[0] * kernel[1])
    else:
        sums = F.avg_pool2d(padded, kernel, stride, divisor_override=1)
    sizes = []
    for i, k, s, p, o in zip(hw, kernel, stride, pad, out):
        start = torch.arange(o, device=x.device) * s - p
        sizes.append(torch.clamp(start + k, max=i + p) - start)  # window clipped at size + pad
    return sums / (sizes[0][:, None] * sizes[1][None, :]).to(x.dtype)


def _onnx_exporting() -> bool:
    """Whether torch.onnx is exporting (never when it was not imported: importing it costs)."""
    onnx = sys.modules.get("torch.onnx")
    return onnx is not None and bool(onnx.is_in_onnx_export())


def _stochastic_pool(x, kernel, stride, out, sample):
    hw = (x.shape[2], x.shape[3])
    xp = F.pad(x, _explicit_pad(hw, kernel, stride, (0, 0), out))
    win = xp.unfold(2, kernel[0], stride[0]).unfold(3, kernel[1], stride[1])
    win = win.reshape(*win.shape[:4], -1)  # window positions in Caffe's scan order
    if sample:  # first position whose running sum reaches u * window sum, u ~ U(0, 1]
        cum = win.cumsum(-1)
        u = 1 - torch.rand(cum.shape[:-1], device=x.device, dtype=x.dtype)
        hit = cum >= (u * cum[..., -1]).unsqueeze(-1)
        pick = hit.to(torch.int32).argmax(-1, keepdim=True)
        return win.gather(-1, pick).squeeze(-1)
    s1, s2 = win.sum(-1), (win * win).sum(-1)
    pos = s1 > 0
    return torch.where(pos, s2 / torch.where(pos, s1, torch.ones_like(s1)), 0.0)


def caffe_pool2d(
    x: torch.Tensor,
    method: int,
    kernel: Pair,
    stride: Pair,
    pad: Pair,
    out: Pair,
    *,
    sample: bool = False,
    want_mask: bool = False,
    finite: bool = False,
):
    """Pool (N, C, H, W) to Caffe's ``out`` size -> (top, mask or None); ``finite``: the
    bottom holds no NaN or infinity (MAX skips its check, see ``_max_pool``).

    On CPU, MAX and AVE pool in channels_last, where torch's kernels vectorize over channels
    (10-25x faster than its NCHW ones); a top is handed back in the bottom's memory format.
    Not under autograd: there the round trip copies twice more in backward and autograd keeps
    the channels_last copy (ResNet-50 fwd+bwd b8, 1 thread: 2558 -> 2474 ms without it;
    GoogLeNet's pools: no change), nor under torch.compile, where inductor picks the layout.
    """
    if method == PP.STOCHASTIC:
        return _stochastic_pool(x, kernel, stride, out, sample), None
    restore = (
        x.is_cpu
        and not _recorded(x)
        and not torch.compiler.is_compiling()
        and not under_func_transform()  # first: its tensors answer no memory-format query
        and not x.is_contiguous(memory_format=torch.channels_last)
    )
    if restore:
        x = x.contiguous(memory_format=torch.channels_last)
    if method == PP.MAX:
        y, mask = _max_pool(x, kernel, stride, pad, out, want_mask, finite)
    else:
        y, mask = _ave_pool(x, kernel, stride, pad, out), None
    if restore:
        y = y.contiguous()
        mask = None if mask is None else mask.contiguous()
    return y, mask


@register_layer("Pooling")
class PoolingLayer(CaffeLayer):
    """2-D pooling. Caffe type ``Pooling``, ``pooling_param``; (N, C, H, W) bottoms only.

    Output: ceil (default ``round_mode``; fork field ``ceil_mode: false`` = FLOOR) or floor of
    (H + 2 * pad - kernel) / stride, plus one; with any pad, a last window starting at or past
    H + pad is dropped. MAX: first maximum in scan order wins and gets the gradient; an
    optional second top is its flat index h * W + w (float). AVE: divides by the window clipped
    to [-pad, H + pad). STOCHASTIC (Caffe's GPU semantics): TRAIN samples a position with
    probability proportional to its activation, TEST gives sum(x^2) / sum(x).
    Differs from torch: output size, pad up to kernel - 1, NaN never selected by MAX; TEST
    STOCHASTIC backward is the gradient of its formula (Caffe reuses stale TRAIN indices).
    """

    param_field = "pooling_param"
    restrictions = (
        "STOCHASTIC TRAIN draws follow Caffe's distribution, not its RNG stream "
        "(Caffe has it on GPU only; here CPU and CUDA)"
    )
    tops = Between(1, 2)

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        self.pool = p.pool
        if self.num_tops > 1 and p.pool != PP.MAX:
            raise self.error(
                "only MAX pooling has a second (mask) top", expected="1 top", got=self.num_tops
            )
        self.global_pooling = p.global_pooling
        self.kernel = self._kernel(p)
        self.pad = self._pair(p, "pad")
        self.stride = self._pair(p, "stride")
        self.ceil = self._ceil(p)
        if self.global_pooling and (self.pad != (0, 0) or self.stride != (1, 1)):
            raise self.error(
                "with global_pooling: true only pad = 0 and stride = 1",
                expected="pad 0, stride 1",
                got=f"pad {self.pad}, stride {self.stride}",
            )
        if any(s <= 0 for s in self.stride):
            raise self.error("stride must be positive", expected="> 0", got=self.stride)
        if self.pad != (0, 0) and p.pool == PP.STOCHASTIC:
            raise self.error(
                "padding implemented only for average and max pooling",
                expected="pad 0 with STOCHASTIC",
                got=self.pad,
            )
        self.geometry(self.bottom_shapes[0])

    def _kernel(self, p) -> Pair | None:
        sized, hw = p.HasField("kernel_size"), p.HasField("kernel_h") and p.HasField("kernel_w")
        if self.global_pooling:
            if sized or p.HasField("kernel_h") or p.HasField("kernel_w"):
                raise self.error(
                    "with global_pooling: true the filter size cannot be specified",
                    expected="no kernel_size/kernel_h/kernel_w",
                    got="a kernel size",
                )
            return None
        if sized == hw:
            raise self.error(
                "filter size is kernel_size OR kernel_h and kernel_w; not both",
                expected="kernel_size, or both kernel_h and kernel_w",
                got="both" if sized else "neither (or only one of kernel_h/w)",
            )
        kernel = (p.kernel_size,) * 2 if sized else (p.kernel_h, p.kernel_w)
        if min(kernel) <= 0:
            raise self.error(
                "filter dimensions cannot be zero", expected="kernel_size > 0", got=kernel
            )
        return kernel

    def _pair(self, p, field: str) -> Pair:
        h, w = f"{field}_h", f"{field}_w"
        if p.HasField(h) or p.HasField(w):
            if p.HasField(field) or not (p.HasField(h) and p.HasField(w)):
                raise self.error(
                    f"{field} is {field} OR {h} and {w} are required",
                    expected=f"{field}, or both {h} and {w}",
                    got="a mix of them",
                )
            return (getattr(p, h), getattr(p, w))
        return (getattr(p, field),) * 2

    def _ceil(self, p) -> bool:
        ceil = p.round_mode == PP.CEIL
        if p.HasField("ceil_mode"):
            if p.HasField("round_mode") and p.ceil_mode != ceil:
                raise self.error(
                    "round_mode and ceil_mode disagree",
                    expected="one of them",
                    got=f"round_mode {PP.RoundMode.Name(p.round_mode)}, ceil_mode {p.ceil_mode}",
                )
            ceil = p.ceil_mode
        return ceil

    def geometry(self, shape) -> tuple[Pair, Pair]:
        """(kernel, output size) for a bottom shape; global pooling follows the bottom."""
        if len(shape) != 4:
            raise self.error(
                "input must have 4 axes (num, channels, height, width)", expected=4, got=len(shape)
            )
        hw = (shape[2], shape[3])
        kernel = hw if self.kernel is None else self.kernel
        if self.pad != (0, 0) and any(p >= k for p, k in zip(self.pad, kernel)):
            raise self.error(
                "pad must be smaller than the kernel", expected=f"< {kernel}", got=self.pad
            )
        clip = self.pad != (0, 0)
        oh, ow = (
            pooled_size(i, k, s, p, self.ceil, clip)
            for i, k, s, p in zip(hw, kernel, self.stride, self.pad)
        )
        out = (oh, ow)
        if min(out) <= 0:
            raise self.error(
                "pooled output size is not positive (kernel larger than the padded bottom)",
                expected="> 0",
                got=f"{out} from {hw}",
            )
        return kernel, out

    def output_shapes(self, bottom_shapes):
        """From ``geometry``, without the meta-tensor forward (whose first run imports torch's
        decompositions: ~0.2 s of a cold build)."""
        shape = tuple(int(d) for d in bottom_shapes[0])
        _, (oh, ow) = self.geometry(shape)
        return [(shape[0], shape[1], oh, ow)] * self.num_tops

    def forward(self, x: torch.Tensor):
        if self.global_pooling and self.num_tops == 1 and torch.jit.is_tracing():
            # the TorchScript ONNX exporter cannot take a kernel read off a traced shape
            # (with a symbolic batch); over the whole plane Caffe's pool is torch's global one
            if self.pool == PP.AVE:
                return F.adaptive_avg_pool2d(x, 1)
            if self.pool == PP.MAX:
                return F.adaptive_max_pool2d(x, 1)
        kernel, out = self.geometry(tuple(x.shape))
        y, mask = caffe_pool2d(
            x,
            self.pool,
            kernel,
            self.stride,
            self.pad,
            out,
            sample=self.training,
            want_mask=self.num_tops > 1,
        )
        return (y, mask) if self.num_tops > 1 else y

    def torch_pool_args(self, shape: tuple[int, ...]) -> tuple[Any, ...] | None:
        """(kernel, stride, pad, ceil_mode) with which torch's own ``max_pool2d`` (over the
        bottom floored at -FLT_MAX) or ``avg_pool2d`` (``count_include_pad``) gives this
        one-top MAX or AVE layer's top for a bottom of ``shape``, as ``forward`` calls them
        where no autograd records and no trace runs; None where torch's flags cannot give
        Caffe's windows (``forward`` pads explicitly) or the bottom is not one this layer
        takes (``forward`` says why)."""
        if self.num_tops != 1 or self.pool not in (PP.MAX, PP.AVE) or len(shape) != 4:
            return None
        try:
            kernel, out = self.geometry(shape)
        except TorchCaffeError:
            return None
        ceil = _torch_ceil_mode((shape[2], shape[3]), kernel, self.stride, self.pad, out)
        return None if ceil is None else (kernel, self.stride, self.pad, ceil)

    def forward_finite(self, x: torch.Tensor) -> torch.Tensor:
        """``forward`` of a one-top MAX pooling over a bottom known to hold no NaN or
        infinity (``finite_pooling``): torch's pooling is then Caffe's, unchecked."""
        kernel, out = self.geometry(tuple(x.shape))
        y, _ = caffe_pool2d(x, self.pool, kernel, self.stride, self.pad, out, finite=True)
        return y
