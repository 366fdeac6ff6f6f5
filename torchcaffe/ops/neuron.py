"""Element-wise neuron layers (Caffe's NeuronLayer family): one bottom, one top, same shape.

ReLU, Sigmoid, TanH, AbsVal, BNLL, Power, Exp, Log, ELU, Threshold, Swish and Clip. Each is a
line or two of torch; where Caffe's backward differs from the mathematical gradient the layer
says so (Power uses a custom Function, Threshold has no backward).

In place (top == bottom), Caffe's Backward reads the shared blob, i.e. the layer's output, as
if it were the input. Where that changes the slope (BNLL, Log, Clip, Power, ReLU with a
negative slope), or where the slope is a value a later in-place layer may rewrite (ELU), an
in-place instance is built with a Function that takes ``caffe_slope`` at its output
(``in_place_slope``); the others keep torch's.
The Caffe face reads the same ``caffe_slope`` at the blob as it is at Backward time.
Power and Log build their slope in the bottom diff over several BLAS passes before multiplying
by the top diff; in place that top diff is the same buffer, so what comes back is the slope
squared, whatever the top diff was (``in_place_backward``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..registry import register_layer
from ._functional.function import CaffeFunction
from ._functional.power import caffe_power
from ._transforms import under_func_transform, with_jvp
from .base import CaffeLayer, Shape

# Caffe's BNLL backward clamps its exp argument here (exp(50) / (exp(50) + 1) == 1 in float).
KBNLL_THRESHOLD = 50.0


class NeuronLayer(CaffeLayer):
    """Base of the element-wise layers; in-place use (top == bottom) is allowed."""

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        in_place = list(layer_param.top[:1]) == list(layer_param.bottom[:1])
        self.in_place_slope = in_place and self.slope_reads_output()
        if self.in_place_slope:  # decided here: other instances run the class's forward
            # ``built_forward``: the net tells it from a forward a user puts there (hook_watch)
            self.forward = self.built_forward = self._forward_slope_at_output

    def slope_reads_output(self) -> bool:
        """Does Caffe's Backward, in place, take a slope at the output that differs from the
        one at the input, or one that a later in-place layer's rewrite of the blob changes?
        (Read from ``self.param`` alone: called before subclass set-up.)"""
        return False

    def caffe_slope(self, x: torch.Tensor) -> torch.Tensor:
        """Caffe's Backward_cpu local slope when the bottom (and top) blob holds ``x``; asked
        only of a layer whose ``slope_reads_output`` is true, which defines it."""
        raise TypeError(f"{self.caffe_type} takes its backward slope at its input")

    # Does Backward_cpu write the slope into the bottom diff before it reads the top diff?
    slope_overwrites_top_diff = False

    def in_place_backward(self, y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        """Caffe's in-place bottom diff from the shared blob's data ``y`` and diff ``dy``."""
        slope = self.caffe_slope(y)
        # caffe_mul(top_diff, bottom_diff, bottom_diff) where top_diff now holds the slope
        return slope * slope if self.slope_overwrites_top_diff else dy * slope

    def _forward_slope_at_output(self, x: torch.Tensor) -> torch.Tensor:
        return with_jvp(SlopeAtOutput).apply(x, self)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        return [tuple(int(d) for d in bottom_shapes[0])]


class SlopeAtOutput(CaffeFunction):
    """An in-place neuron layer: Caffe's Backward reads the overwritten blob, so the slope
    is ``layer.caffe_slope`` at the output."""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(x, layer):
        return type(layer).forward(layer, x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.layer = inputs[1]
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return ctx.layer.in_place_backward(y, grad), None

    @staticmethod
    def tangent(ctx, x_t, _):
        """The tangent times Caffe's slope at the output (where its in-place backward ignores
        the top diff, writing the slope squared, there is no linear map to transpose)."""
        (y,) = ctx.saved_tensors
        return x_t * ctx.layer.caffe_slope(y)


class SlopeAtInput(CaffeFunction):
    """A neuron layer whose torch gradient is not Caffe's at some inputs: the layer's
    ``values``, and ``layer.caffe_slope`` at the input for the backward. (Clip: torch.clamp's
    gradient at a bound is a convention torch changed, passing it up to 2.13 and none from
    2.14, where Caffe's mask includes the bounds.)"""

    generate_vmap_rule = True  # torch.func batches it (ops/_transforms.py)

    @staticmethod
    def forward(x, layer):
        return layer.values(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.layer = inputs[1]
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * ctx.layer.caffe_slope(x), None

    @staticmethod
    def tangent(ctx, x_t, _):  # the backward's transpose: the same slope per element
        (x,) = ctx.saved_tensors
        return x_t * ctx.layer.caffe_slope(x)


def _log_base(layer: CaffeLayer, base: float) -> float:
    """Caffe's Exp/Log setup: base -1 means e (log 1 exactly); otherwise base > 0, finite log."""
    if base == -1:
        return 1.0
    if not base > 0:
        raise layer.error("base must be strictly positive (or -1 for e)", expected="> 0", got=base)
    log_base = math.log(base)
    if not math.isfinite(log_base):
        raise layer.error("log(base) is not finite", expected="a finite base", got=base)
    return log_base


@register_layer("ReLU")
class ReLULayer(NeuronLayer):
    """max(x, 0) + negative_slope * min(x, 0). Caffe type ``ReLU``, ``relu_param``.

    Differs from torch: none (the gradient at 0 is negative_slope, as torch's leaky_relu).
    Differs from Caffe's CPU and CUDA kernels in one value: with slope 0, -inf gives 0 here
    and NaN there (0 * -inf). torch's leaky_relu with slope 0 would give NaN, at 1-2% of a
    batch-1 forward in-net (MobileNetV2, ResNet-50, GoogLeNet), so it is left as is.
    """

    param_field = "relu_param"

    def slope_reads_output(self) -> bool:
        return self.param.negative_slope < 0

    def caffe_slope(self, x: torch.Tensor) -> torch.Tensor:
        return (x > 0).to(x.dtype) + self.param.negative_slope * (x <= 0).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slope = self.param.negative_slope
        return F.leaky_relu(x, slope) if slope else F.relu(x)


@register_layer("Sigmoid")
class SigmoidLayer(NeuronLayer):
    """1 / (1 + exp(-x)). Caffe type ``Sigmoid``, ``sigmoid_param`` (engine only).

    Differs from torch: none (Caffe evaluates 0.5 * tanh(0.5 x) + 0.5 in double precision,
    which torch.sigmoid matches to float rounding).
    """

    param_field = "sigmoid_param"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)


@register_layer("TanH")
class TanHLayer(NeuronLayer):
    """tanh(x). Caffe type ``TanH``, ``tanh_param`` (engine only).

    Differs from torch: none.
    """

    param_field = "tanh_param"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


@register_layer("AbsVal")
class AbsValLayer(NeuronLayer):
    """|x|. Caffe type ``AbsVal``; no params. Caffe refuses in-place use.

    Differs from torch: none (the gradient is sign(x), 0 at x == 0, as torch.abs).
    """

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        if list(layer_param.top[:1]) == list(layer_param.bottom[:1]):
            raise self.error(
                "AbsVal does not allow in-place computation",
                expected="a top blob other than the bottom",
                got=f"top {layer_param.top[0]!r} == bottom",
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.abs(x)


@register_layer("BNLL")
class BNLLLayer(NeuronLayer):
    """log(1 + exp(x)), evaluated stably. Caffe type ``BNLL``; no params.

    Backward is exp(min(x, 50)) / (exp(min(x, 50)) + 1), torch's softplus with threshold 50.
    Differs from torch: none.
    """

    def slope_reads_output(self) -> bool:
        return True

    def caffe_slope(self, x: torch.Tensor) -> torch.Tensor:
        e = torch.exp(torch.clamp(x, max=KBNLL_THRESHOLD))
        return e / (e + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softplus(x, beta=1.0, threshold=KBNLL_THRESHOLD)


@register_layer("Power")
class PowerLayer(NeuronLayer):
    """(shift + scale * x) ^ power. Caffe type ``Power``, ``power_param`` (power, scale, shift).

    Differs from torch: Caffe's backward is power * y / x (shift 0) or
    power * scale * y / (shift + scale * x), so it is NaN or inf where the base is 0, and it is
    0 when power or scale is 0 (the output is then the constant 1 or shift ^ power).
    """

    param_field = "power_param"
    slope_overwrites_top_diff = True

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        self.power, self.scale, self.shift = p.power, p.scale, p.shift

    def slope_reads_output(self) -> bool:
        # power 1: a constant slope, but in place it still replaces the top diff
        return self.param.power * self.param.scale != 0

    def caffe_slope(self, x: torch.Tensor) -> torch.Tensor:
        # PowerLayer::Backward_cpu with bottom and top data both ``x``
        return self.caffe_slope_at(x, x)

    def caffe_slope_at(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """PowerLayer::Backward_cpu's local slope with bottom data ``x`` and top data ``y``."""
        diff_scale = self.power * self.scale
        if diff_scale == 0 or self.power == 1:
            return torch.full_like(x, diff_scale)
        if self.power == 2:
            slope = x * (diff_scale * self.scale)
            return slope + diff_scale * self.shift if self.shift != 0 else slope
        if self.shift == 0:
            return (y / x) * self.power
        slope = y / (x * self.scale + self.shift if self.scale != 1 else x + self.shift)
        return slope * diff_scale if diff_scale != 1 else slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return caffe_power(x, self.power, self.scale, self.shift)


@register_layer("Exp")
class ExpLayer(NeuronLayer):
    """base ^ (shift + scale * x); base -1 means e. Caffe type ``Exp``, ``exp_param``.

    Computed as Caffe does: base^shift * exp(log(base) * scale * x).
    Differs from torch: none.
    """

    param_field = "exp_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        log_base = _log_base(self, p.base)
        self.inner_scale = log_base * p.scale
        self.outer_scale = 1.0
        if p.shift != 0:
            try:
                self.outer_scale = math.exp(p.shift) if p.base == -1 else math.pow(p.base, p.shift)
            except OverflowError:  # C's pow/exp give inf, and so does the top
                self.outer_scale = math.inf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.exp(x if self.inner_scale == 1 else x * self.inner_scale)
        return y if self.outer_scale == 1 else y * self.outer_scale


@register_layer("Log")
class LogLayer(NeuronLayer):
    """log_base(shift + scale * x); base -1 means e. Caffe type ``Log``, ``log_param``.

    base must be positive and not 1 (Caffe checks 1 / log(base) is finite).
    Differs from torch: none.
    """

    param_field = "log_param"
    slope_overwrites_top_diff = True

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        log_base = _log_base(self, p.base)
        if log_base == 0:
            raise self.error("1 / log(base) is not finite", expected="base != 1", got=p.base)
        self.base_scale = 1.0 / log_base
        self.input_scale, self.input_shift = p.scale, p.shift
        # LogLayer::LayerSetUp's backward_num_scale_, a float: input_scale / log(base)
        self.backward_num_scale = float(
            torch.tensor(p.scale, dtype=torch.float32) / torch.tensor(log_base, dtype=torch.float32)
        )

    def slope_reads_output(self) -> bool:
        return True

    def caffe_slope(self, x: torch.Tensor) -> torch.Tensor:
        # LogLayer::Backward_cpu: backward_num_scale / (input_scale * x + input_shift)
        if self.input_scale != 1:
            x = x * self.input_scale
        if self.input_shift != 0:
            x = x + self.input_shift
        slope = torch.pow(x, -1)
        return slope if self.backward_num_scale == 1 else slope * self.backward_num_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_scale != 1:
            x = x * self.input_scale
        if self.input_shift != 0:
            x = x + self.input_shift
        y = torch.log(x)
        return y if self.base_scale == 1 else y * self.base_scale


@register_layer("ELU")
class ELULayer(NeuronLayer):
    """x if x > 0 else alpha * (exp(x) - 1). Caffe type ``ELU``, ``elu_param`` (alpha).

    Differs from torch: none (the gradient at 0 is alpha, as torch's elu).
    """

    param_field = "elu_param"

    def slope_reads_output(self) -> bool:
        # With alpha >= 0 the slope at its own output is the one at its input, but Caffe's
        # reads the blob at Backward time, which a later in-place layer (Dropout) rescales.
        return True

    def caffe_slope(self, x: torch.Tensor) -> torch.Tensor:
        # ELULayer::Backward_cpu with bottom and top data both ``x``
        return self.caffe_slope_at(x, x)

    def caffe_slope_at(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """ELULayer::Backward_cpu's local slope with bottom data ``x`` and top data ``y``:
        (bottom > 0) + (alpha + top) * (bottom <= 0)."""
        return (x > 0).to(y.dtype) + (self.param.alpha + y) * (x <= 0).to(y.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.elu(x, alpha=self.param.alpha)


@register_layer("Threshold")
class ThresholdLayer(NeuronLayer):
    """1 where x > threshold (strictly), else 0. Caffe type ``Threshold``, ``threshold_param``.

    Differs from torch: forward only (Caffe's backward is not implemented).
    """

    param_field = "threshold_param"
    has_backward = False
    backward_aborts = True  # Backward: NOT_IMPLEMENTED

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.detach() > self.param.threshold).to(x.dtype)


@register_layer("Swish")
class SwishLayer(NeuronLayer):
    """x * sigmoid(beta * x). Caffe type ``Swish``, ``swish_param`` (beta).

    Differs from torch: none (beta == 1 is torch's silu).
    """

    param_field = "swish_param"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        beta = self.param.beta
        return F.silu(x) if beta == 1 else x * torch.sigmoid(x * beta)


@register_layer("Clip")
class ClipLayer(NeuronLayer):
    """max(min, min(x, max)). Caffe type ``Clip``, ``clip_param`` (min, max: both required).

    The gradient passes where min <= x <= max (bounds included). With min > max the output is
    min everywhere and the gradient 0, as in Caffe.
    Differs from torch: torch.clamp gives max everywhere when min > max, and its gradient at a
    bound depends on the torch release (``SlopeAtInput``). Differs from Caffe: NaN stays NaN,
    where Caffe's CPU gives min and its GPU max.
    """

    param_field = "clip_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if layer_param.HasField("clip_param"):
            missing = [f for f in ("min", "max") if not p.HasField(f)]
            if missing:
                raise self.error(
                    "clip_param is missing a required field",
                    expected="both min and max",
                    got=f"no {' and '.join(missing)}",
                )
        self.min, self.max = p.min, p.max

    def slope_reads_output(self) -> bool:
        return True

    def caffe_slope(self, x: torch.Tensor) -> torch.Tensor:
        return ((x >= self.min) & (x <= self.max)).to(x.dtype)

    def values(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, self.min, self.max)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.min > self.max:  # no x is inside: no gradient on any torch
            return torch.clamp(torch.clamp(x, max=self.max), min=self.min)
        recorded = x.requires_grad and torch.is_grad_enabled()
        if (recorded or under_func_transform()) and not torch.jit.is_tracing():
            return with_jvp(SlopeAtInput).apply(x, self)
        return self.values(x)  # no gradient taken (or a jit trace's)
