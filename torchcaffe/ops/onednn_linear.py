"""A large InnerProduct's product on oneDNN's matmul on the CPU (``linear``).

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

Under autograd the forward and the bottom's gradient, the same product with the weight read
transposed, run on oneDNN, and the weight's gradient on torch's mm as before
(``_OneDnnLinear``): CaffeNet's fc6 at batch 8, forward + backward, 2 threads, 86 -> 72 ms,
fc7 40 -> 33 ms.

The InnerProduct layer (and a folded one) calls it, so every path gets it: the torch face,
the Caffe face's layer-by-layer forward and backward, and a solver's step. Only the order of
the dot products' additions changes: the outputs and gradients stay within the golden
tolerances (the conformance suite runs every golden case through it with MIN_WEIGHTS at
zero). Under torch.compile the product is the opaque op ``torchcaffe::onednn_linear``
(``_graph_op``, forward and backward as above), except for torch.export, whose program must
stand alone. Any call oneDNN cannot take as it is (not the CPU, not float32, torch.export,
torch.jit's tracer, or ``torch.backends.mkldnn`` off) runs ``F.linear``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from . import frozen_graph, fused_relu
from ._exporting import exporting
from ._transforms import under_func_transform, with_jvp

# Weights (N * K) from which oneDNN's matmul is faster than MKL's at every batch measured.
MIN_WEIGHTS = 1 << 18


def _onednn_matmul() -> Any | None:
    """oneDNN's linear op where this torch build has it, else None."""
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(torch.ops.mkldnn, "_linear_pointwise", None)


_LINEAR = _onednn_matmul()


def available() -> bool:
    """Does this torch build have oneDNN's linear op (else ``linear`` is ``F.linear``)?"""
    return _LINEAR is not None


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    relu: fused_relu.Slope = None,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a 2-D ``x``, on oneDNN where it can run as is and
    ``weight`` has at least MIN_WEIGHTS elements; then the ReLU of slope ``relu``, if any
    (``fused_relu``: in oneDNN's epilogue where it runs, which autograd must not record)."""
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if _LINEAR is None or weight.numel() < MIN_WEIGHTS:
        return fused_relu.apply_(F.linear(x, weight, bias), relu)
    recorded = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    if _onednn_can_take(tensors):
        if recorded:
            return fused_relu.apply_(with_jvp(_OneDnnLinear).apply(x, weight, bias), relu)
        return fused_relu.onednn_call(_LINEAR, relu, x, weight, bias)
    if _GRAPH_LINEAR is not None and graph_can_take(tensors):
        return fused_relu.apply_(_GRAPH_LINEAR(x, weight, bias), relu)
    return fused_relu.apply_(F.linear(x, weight, bias), relu)


def graph_can_take(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether a torch.compile trace may call one of our opaque CPU ops (this module's and
    ``opaque_conv``'s) or oneDNN's own (``small_bottom_conv``) on ``tensors``: compiling but
    not exporting (torch.export also turns oneDNN off while it traces), CPU float32 tensors,
    no CPU autocast, oneDNN on, and inductor not freezing the params (``frozen_graph``: it
    then packs and fuses the plain ops itself)."""
    if not torch.compiler.is_compiling() or exporting():
        return False
    if frozen_graph.params_frozen():
        return False
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors):
        return False
    if torch.is_autocast_enabled("cpu"):
        return False  # our ops are no autocast ops: torch's run in the autocast dtype
    return bool(torch.backends.mkldnn.enabled)


def graph_ops_definable() -> bool:
    """Whether this torch build can define our opaque graph ops (``torch.library.custom_op``)
    and tell torch.export from torch.compile (both from torch 2.4; every torch the pin
    admits, 2.10 on, has them, but a custom build may lack ``custom_op``)."""
    return hasattr(torch.library, "custom_op") and hasattr(torch.compiler, "is_exporting")


def _graph_op() -> Any | None:
    """oneDNN's product as an opaque op of a compiled graph (with a backward): inductor lowers
    ``mkldnn::_linear_pointwise`` only for frozen weights and sends ``F.linear`` to MKL's
    sgemm, whose batch-1 product runs on one thread (CaffeNet compiled, batch 1: the eager
    net's 16 ms against 19 ms)."""
    if _LINEAR is None or not graph_ops_definable():
        return None

    @torch.library.custom_op("torchcaffe::onednn_linear", mutates_args=())
    def onednn_linear(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return _LINEAR(x, weight, bias, "none", [], "")  # type: ignore[misc]

    @onednn_linear.register_fake
    def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return x.new_empty((x.shape[0], weight.shape[0]))

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x, weight, _bias = inputs
        ctx.save_for_backward(x, weight)

    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        return _product_backward(grad, x, weight, ctx.needs_input_grad, onednn_linear)

    onednn_linear.register_autograd(backward, setup_context=setup_context)
    return onednn_linear


_GRAPH_LINEAR = _graph_op()


def pixel_rows_product(
    rows: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    relu: fused_relu.Slope = None,
) -> torch.Tensor:
    """``rows @ weight.T + bias``: a dense 1x1 convolution over a channels_last bottom, whose
    (N*H*W, C) pixel rows are a free view, where no packed weight serves (``conv2d``: under
    autograd, or called without a cache), and a classifier over 1x1 features. On oneDNN's
    matmul, with the bias added in its epilogue, where it can take the call and autograd
    records nothing; else ``addmm``, which first copies the bias into every row of its
    output, one more pass over the top.

    Against ``addmm`` when every inference 1x1 convolution ran here (before they ran on
    packed weights), in-net, 2 threads, batch 1, median of 40 interleaved: MobileNetV2 and
    ResNet-50 4% faster (ResNet-50's addmm bias copies alone took 3.4 of its 60 ms); batch
    8: 12-13%. Every
    size: oneDNN splits the pixel rows over the threads where MKL's sgemm runs a 49-row
    product (7x7) on one, 0.82 -> 0.62 ms for ResNet-50's 2048 -> 512 at batch 1.
    Under torch.compile a product of MIN_WEIGHTS weights or more is the opaque op, as
    ``linear``'s: MobileNetV2's classifier (1280 -> 1000, batch 1) took 0.27 ms in addmm,
    now 0.16 ms in oneDNN plus 0.05 ms of the op's dispatch.
    Then the ReLU of slope ``relu``, if any (``fused_relu``)."""
    tensors = (rows, weight) if bias is None else (rows, weight, bias)
    recorded = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    if _LINEAR is not None and not recorded and _onednn_can_take(tensors):
        return fused_relu.onednn_call(_LINEAR, relu, rows, weight, bias)
    if _GRAPH_LINEAR is not None and weight.numel() >= MIN_WEIGHTS and graph_can_take(tensors):
        return fused_relu.apply_(_GRAPH_LINEAR(rows, weight, bias), relu)
    y = rows @ weight.t() if bias is None else torch.addmm(bias, rows, weight.t())
    return fused_relu.apply_(y, relu)


def _onednn_can_take(tensors: tuple[torch.Tensor, ...]) -> bool:
    """CPU float32 tensors, oneDNN on, and not under torch.compile (inductor lowers the op
    only for frozen, constant weights), torch.jit's tracer (the TorchScript ONNX exporter
    cannot take the op) or a torch.func transform (which has no batching rule for it)."""
    if not all(t.is_cpu and t.dtype == torch.float32 for t in tensors):
        return False
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or under_func_transform():
        return False
    if torch.is_autocast_enabled("cpu"):
        return False  # oneDNN's op is no autocast op: F.linear runs in the autocast dtype
    return bool(torch.backends.mkldnn.enabled)


class _OneDnnLinear(torch.autograd.Function):
    """``x @ weight.T + bias`` with autograd: the forward and the gradient of ``x`` (the same
    kind of product, with the weight read transposed) on oneDNN; the weight's gradient
    (``grad.T @ x``) and the bias's (a sum over the batch) as F.linear's backward has them."""

    @staticmethod
    def forward(ctx, x, weight, bias):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.save_for_forward(x, weight)
        return _LINEAR(x, weight, bias, "none", [], "")  # type: ignore[misc]

    @staticmethod
    def tangent(ctx, x_t, weight_t, bias_t):
        """(torch.autograd.forward_ad) The product rule, in torch's own ops."""
        x, weight = ctx.saved_tensors
        out = torch.zeros(*x.shape[:-1], weight.shape[0], dtype=x.dtype, device=x.device)
        if x_t is not None:
            out = out + x_t @ weight.t()
        if weight_t is not None:
            out = out + x @ weight_t.t()
        return out if bias_t is None else out + bias_t

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        return _product_backward(grad, x, weight, ctx.needs_input_grad, _eager_product)


def _eager_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return _LINEAR(x, weight, bias, "none", [], "")  # type: ignore[misc]


def _product_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    needs: tuple[bool, ...],
    product: Any,
) -> tuple[torch.Tensor | None, ...]:
    """The gradients of ``x @ weight.T + bias`` for the eager and the graph op alike: the
    bottom's by ``product`` (oneDNN, the weight read transposed), the weight's and the bias's
    as F.linear's backward has them."""
    need_x, need_w, need_b = needs
    grad = grad.contiguous()
    grad_x = product(grad, weight.t(), None) if need_x else None
    grad_w = grad.t() @ x if need_w else None
    grad_b = grad.sum(0) if need_b else None
    return grad_x, grad_w, grad_b
