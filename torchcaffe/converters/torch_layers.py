"""How each torch op becomes Caffe layers, for ``torch_to_caffe``'s exporter.

One handler per ``torch.nn`` module type (``Handler``: exporter, fx node, module, bottom blob);
functional calls and Tensor methods are first turned into the equivalent module, so both
spellings share one mapping. Handlers add layers through the exporter and raise its
``unsupported`` error for what Caffe cannot express.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..ops.pooling import pooled_size
from ..proto import caffe_pb2

if TYPE_CHECKING:
    from .torch_to_caffe import _Exporter

PP = caffe_pb2.PoolingParameter


def pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        return (int(v[0]), int(v[1])) if len(v) == 2 else (int(v[0]), int(v[0]))
    return (int(v), int(v))


def set_hw(msg: Any, field: str, value: tuple[int, int], default: int | None) -> None:
    """``field`` once when both axes agree, else ``<field>_h``/``<field>_w``."""
    base = {"kernel": "kernel_size"}.get(field, field)
    h, w = value
    if h == w:
        if default is not None and h == default:
            return
        target = getattr(msg, base)
        if hasattr(target, "append"):
            target.append(h)
        else:
            setattr(msg, base, h)
    else:
        setattr(msg, f"{field}_h", h)
        setattr(msg, f"{field}_w", w)


# -- functional calls as their module equivalents ---------------------------------------------
def _arg(args: list, kwargs: dict, i: int, key: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(key, default)


FUNCTION_MODULES: dict[Any, Callable[[list, dict], nn.Module | None]] = {
    F.relu: lambda a, k: nn.ReLU(),
    torch.relu: lambda a, k: nn.ReLU(),
    F.relu6: lambda a, k: nn.ReLU6(),
    F.leaky_relu: lambda a, k: nn.LeakyReLU(_arg(a, k, 0, "negative_slope", 0.01)),
    F.elu: lambda a, k: nn.ELU(_arg(a, k, 0, "alpha", 1.0)),
    F.hardtanh: lambda a, k: nn.Hardtanh(
        _arg(a, k, 0, "min_val", -1.0), _arg(a, k, 1, "max_val", 1.0)
    ),
    torch.sigmoid: lambda a, k: nn.Sigmoid(),
    F.sigmoid: lambda a, k: nn.Sigmoid(),
    torch.tanh: lambda a, k: nn.Tanh(),
    F.tanh: lambda a, k: nn.Tanh(),
    F.hardswish: lambda a, k: nn.Hardswish(),
    F.silu: lambda a, k: nn.SiLU(),
    F.softplus: lambda a, k: nn.Softplus(
        _arg(a, k, 0, "beta", 1.0), _arg(a, k, 1, "threshold", 20.0)
    ),
    F.pad: lambda a, k: _pad(a, k),
    torch.clamp: lambda a, k: _clamp(a, k),
    torch.clip: lambda a, k: _clamp(a, k),
    F.hardsigmoid: lambda a, k: nn.Hardsigmoid(),
    F.max_pool2d: lambda a, k: nn.MaxPool2d(
        _arg(a, k, 0, "kernel_size", None),
        _arg(a, k, 1, "stride", None),
        _arg(a, k, 2, "padding", 0),
        _arg(a, k, 3, "dilation", 1),
        ceil_mode=_arg(a, k, 4, "ceil_mode", False),
        return_indices=_arg(a, k, 5, "return_indices", False),
    ),
    F.avg_pool2d: lambda a, k: nn.AvgPool2d(
        _arg(a, k, 0, "kernel_size", None),
        _arg(a, k, 1, "stride", None),
        _arg(a, k, 2, "padding", 0),
        _arg(a, k, 3, "ceil_mode", False),
        _arg(a, k, 4, "count_include_pad", True),
        _arg(a, k, 5, "divisor_override", None),
    ),
    F.adaptive_avg_pool2d: lambda a, k: nn.AdaptiveAvgPool2d(_arg(a, k, 0, "output_size", None)),
    F.adaptive_max_pool2d: lambda a, k: nn.AdaptiveMaxPool2d(_arg(a, k, 0, "output_size", None)),
    F.softmax: lambda a, k: nn.Softmax(_arg(a, k, 0, "dim", None)),
    torch.softmax: lambda a, k: nn.Softmax(_arg(a, k, 0, "dim", None)),
    torch.flatten: lambda a, k: nn.Flatten(
        _arg(a, k, 0, "start_dim", 0), _arg(a, k, 1, "end_dim", -1)
    ),
    F.interpolate: lambda a, k: nn.Upsample(
        _arg(a, k, 0, "size", None),
        _arg(a, k, 1, "scale_factor", None),
        _arg(a, k, 2, "mode", "nearest"),
        _arg(a, k, 3, "align_corners", None),
    ),
    F.pixel_shuffle: lambda a, k: nn.PixelShuffle(_arg(a, k, 0, "upscale_factor", None)),
    torch.pixel_shuffle: lambda a, k: nn.PixelShuffle(_arg(a, k, 0, "upscale_factor", None)),
}

METHOD_MODULES: dict[str, Callable[[list, dict], nn.Module]] = {
    "relu": lambda a, k: nn.ReLU(),
    "clamp": lambda a, k: _clamp(a, k),
    "clip": lambda a, k: _clamp(a, k),
    "sigmoid": lambda a, k: nn.Sigmoid(),
    "tanh": lambda a, k: nn.Tanh(),
    "flatten": lambda a, k: nn.Flatten(_arg(a, k, 0, "start_dim", 0), _arg(a, k, 1, "end_dim", -1)),
    "softmax": lambda a, k: nn.Softmax(_arg(a, k, 0, "dim", None)),
}


# element-wise functions with no torch module: the parameterless Caffe layer each one is
# (Exp and Log with their default base -1, e; scale 1 and shift 0 leave x as it is)
FUNCTION_LAYERS: dict[Any, str] = {torch.abs: "AbsVal", torch.exp: "Exp", torch.log: "Log"}
METHOD_LAYERS: dict[str, str] = {"abs": "AbsVal", "exp": "Exp", "log": "Log"}


def _clamp(args: list, kwargs: dict) -> nn.Module:
    """clamp/clip with both bounds is a Hardtanh (Clip, or ReLU6 for 0..6), ``min=0`` alone a
    ReLU; one other bound alone has no Caffe layer (Clip's open side would be FLT_MAX, which
    turns an infinity finite)."""
    lo, hi = _arg(args, kwargs, 0, "min", None), _arg(args, kwargs, 1, "max", None)
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
        return nn.Hardtanh(float(lo), float(hi))
    if hi is None and isinstance(lo, (int, float)) and lo == 0:
        return nn.ReLU()
    return _Unsupported(f"clamp(min={lo!r}, max={hi!r})")


def _pad(args: list, kwargs: dict) -> nn.Module:
    """F.pad of the last two axes as the padding module of its mode."""
    pad = tuple(_arg(args, kwargs, 0, "pad", ()))
    mode = _arg(args, kwargs, 1, "mode", "constant")
    value = _arg(args, kwargs, 2, "value", None)
    if len(pad) not in (2, 4):
        return _Unsupported(f"F.pad of {len(pad) // 2} axes (the fork's Pad takes H and W)")
    pad4 = pad + (0, 0) if len(pad) == 2 else pad
    if mode == "constant":
        return nn.ConstantPad2d(pad4, float(value or 0.0))
    if mode == "reflect":
        return nn.ReflectionPad2d(pad4)
    if mode == "replicate":
        return nn.ReplicationPad2d(pad4)
    return _Unsupported(f"F.pad mode {mode!r}")


class _Unsupported(nn.Module):
    """A functional call whose arguments no Caffe layer takes: its handler says which."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what


# -- modules ------------------------------------------------------------------------------------
Handler = Callable[["_Exporter", fx.Node, Any, str], None]


def _conv(ex: _Exporter, node: fx.Node, m: nn.Conv2d, bottom: str) -> None:
    pad = _conv_padding(ex, node, m)
    if m.padding_mode != "zeros":
        # torch pads by the mode, then convolves unpadded: the fork's Pad, then the layer
        if m.padding_mode not in _PAD_TYPES:
            raise ex.unsupported(node, f"Conv2d with padding_mode={m.padding_mode!r}")
        ex.fork_only(node, "Pad")
        lp = ex.layer(node, "Pad", [bottom], suffix="/pad", last=False)
        _pad_param(lp.pad_param, m.padding_mode, (pad[1], pad[1], pad[0], pad[0]), 0.0)
        bottom, pad = lp.top[0], (0, 0)
    blobs = [m.weight] + ([m.bias] if m.bias is not None else [])
    lp = ex.layer(node, "Convolution", [bottom], blobs=blobs)
    _conv_param(lp.convolution_param, m, pad)


def _conv_padding(ex: _Exporter, node: fx.Node, m: Any) -> tuple[int, int]:
    if isinstance(m.padding, str):
        if m.padding == "valid":
            return (0, 0)
        extent = [d * (k - 1) for k, d in zip(m.kernel_size, m.dilation)]
        if any(e % 2 for e in extent):
            raise ex.unsupported(node, "Conv2d padding='same' with an asymmetric pad")
        return (extent[0] // 2, extent[1] // 2)
    return pair(m.padding)


def _conv_param(cp: Any, m: Any, pad: tuple[int, int]) -> None:
    cp.num_output = m.out_channels
    if m.bias is None:
        cp.bias_term = False
    if m.groups != 1:
        cp.group = m.groups
    set_hw(cp, "kernel", pair(m.kernel_size), None)
    set_hw(cp, "stride", pair(m.stride), 1)
    set_hw(cp, "pad", pad, 0)
    dilation = pair(m.dilation)
    if dilation != (1, 1):
        cp.dilation.extend(dilation if dilation[0] != dilation[1] else dilation[:1])


def _deconv(ex: _Exporter, node: fx.Node, m: nn.ConvTranspose2d, bottom: str) -> None:
    if any(pair(m.output_padding)):
        raise ex.unsupported(
            node, "ConvTranspose2d with output_padding (Caffe's Deconvolution has none)"
        )
    if m.padding_mode != "zeros":
        raise ex.unsupported(node, f"ConvTranspose2d with padding_mode={m.padding_mode!r}")
    blobs = [m.weight] + ([m.bias] if m.bias is not None else [])
    lp = ex.layer(node, "Deconvolution", [bottom], blobs=blobs)
    _conv_param(lp.convolution_param, m, pair(m.padding))


def _linear(ex: _Exporter, node: fx.Node, m: nn.Linear, bottom: str) -> None:
    blobs = [m.weight] + ([m.bias] if m.bias is not None else [])
    lp = ex.layer(node, "InnerProduct", [bottom], blobs=blobs)
    p = lp.inner_product_param
    p.num_output = m.out_features
    if m.bias is None:
        p.bias_term = False
    axis = len(ex.shape(node.args[0])) - 1  # torch: the last axis; Caffe flattens from axis
    if axis != 1:
        p.axis = axis


def _batch_norm(
    ex: _Exporter, node: fx.Node, m: nn.modules.batchnorm._BatchNorm, bottom: str
) -> None:
    if m.running_mean is None or m.running_var is None:
        raise ex.unsupported(
            node, f"{type(m).__name__} without running stats (track_running_stats=False)"
        )
    one = torch.ones(1, dtype=m.running_mean.dtype)
    lp = ex.layer(node, "BatchNorm", [bottom], blobs=[m.running_mean, m.running_var, one])
    lp.batch_norm_param.use_global_stats = True
    lp.batch_norm_param.eps = float(m.eps)
    if m.affine:
        # in place on the BatchNorm's top, as Caffe models pair them: tools that fuse the
        # pair (caffe2onnx) read its output under that name and refuse a Scale of its own top
        sp = ex.layer(
            node, "Scale", [lp.top[0]], suffix="/scale", blobs=[m.weight, m.bias], last=False
        )
        sp.top[0] = lp.top[0]
        sp.scale_param.bias_term = True


def _neuron(type_: str) -> Handler:
    def handler(ex: _Exporter, node: fx.Node, m: Any, bottom: str) -> None:
        ex.layer(node, type_, [bottom])

    return handler


def _leaky_relu(ex: _Exporter, node: fx.Node, m: nn.LeakyReLU, bottom: str) -> None:
    ex.layer(node, "ReLU", [bottom]).relu_param.negative_slope = float(m.negative_slope)


def _prelu(ex: _Exporter, node: fx.Node, m: nn.PReLU, bottom: str) -> None:
    # One shared slope is written per channel: the same function, and OpenCV cannot read
    # the 0-axis blob of Caffe's channel_shared form.
    channels = ex.shape(node.args[0])[1] if len(ex.shape(node.args[0])) > 1 else 1
    weight = m.weight.expand(channels) if m.num_parameters == 1 else m.weight
    ex.layer(node, "PReLU", [bottom], blobs=[weight])


def _elu(ex: _Exporter, node: fx.Node, m: nn.ELU, bottom: str) -> None:
    ex.layer(node, "ELU", [bottom]).elu_param.alpha = float(m.alpha)


def _hardtanh(ex: _Exporter, node: fx.Node, m: nn.Hardtanh, bottom: str) -> None:
    lo, hi = float(m.min_val), float(m.max_val)
    if lo == 0.0 and hi == 6.0 and not ex.strict:
        ex.layer(node, "ReLU6", [bottom])  # brocolli's ReLU6: what OpenCV and forks read
        return
    lp = ex.layer(node, "Clip", [bottom])  # BVLC master's Clip
    lp.clip_param.min, lp.clip_param.max = lo, hi


def _hardswish(ex: _Exporter, node: fx.Node, m: nn.Hardswish, bottom: str) -> None:
    ex.fork_only(node, "HardSwish")
    ex.layer(node, "HardSwish", [bottom])


def _hardsigmoid(ex: _Exporter, node: fx.Node, m: nn.Hardsigmoid, bottom: str) -> None:
    ex.fork_only(node, "HardSigmoid")
    lp = ex.layer(node, "HardSigmoid", [bottom])
    lp.hardsigmoid_param.alpha, lp.hardsigmoid_param.beta = 1.0 / 6.0, 0.5


def _softplus(ex: _Exporter, node: fx.Node, m: nn.Softplus, bottom: str) -> None:
    # Caffe's BNLL is log(1 + e^x) everywhere; torch's Softplus returns x past its threshold,
    # where the two agree in float32 only from about 17 on
    if m.beta != 1 or m.threshold < 20:
        raise ex.unsupported(
            node, f"Softplus(beta={m.beta}, threshold={m.threshold}) (BNLL is beta 1, no cut)"
        )
    ex.layer(node, "BNLL", [bottom])


_PAD_TYPES = {
    "constant": caffe_pb2.PadParameter.CONSTANT,
    "zeros": caffe_pb2.PadParameter.CONSTANT,
    "reflect": caffe_pb2.PadParameter.REFLECT,
    "replicate": caffe_pb2.PadParameter.REPLICATE,
}


def _pad_param(p: Any, mode: str, pad: tuple[int, ...], value: float) -> None:
    """torch's (left, right, top, bottom) as the fork's pad_l, pad_r, pad_u, pad_d."""
    p.pad_type = _PAD_TYPES[mode]
    p.pad_l, p.pad_r, p.pad_u, p.pad_d = (int(v) for v in pad)
    if value:
        p.pad_value = value


def _pad_module(ex: _Exporter, node: fx.Node, m: Any, bottom: str) -> None:
    if len(ex.shape(node.args[0])) != 4:
        raise ex.unsupported(node, f"{type(m).__name__} of a {len(ex.shape(node.args[0]))}-D input")
    pad = tuple(int(v) for v in m.padding)
    if any(v < 0 for v in pad):
        raise ex.unsupported(node, f"{type(m).__name__} with a negative pad {pad}")
    mode = {nn.ReflectionPad2d: "reflect", nn.ReplicationPad2d: "replicate"}.get(
        type(m), "constant"
    )
    ex.fork_only(node, "Pad")
    lp = ex.layer(node, "Pad", [bottom])
    _pad_param(lp.pad_param, mode, pad, float(getattr(m, "value", 0.0)))


def _unsupported(ex: _Exporter, node: fx.Node, m: _Unsupported, bottom: str) -> None:
    raise ex.unsupported(node, m.what)


def _pool(ex: _Exporter, node: fx.Node, m: Any, bottom: str) -> None:
    is_max = isinstance(m, nn.MaxPool2d)
    kernel = pair(m.kernel_size)
    stride = pair(m.stride if m.stride is not None else m.kernel_size)
    pad = pair(m.padding)
    if is_max and (pair(m.dilation) != (1, 1) or m.return_indices):
        raise ex.unsupported(node, "MaxPool2d with dilation or return_indices")
    if not is_max:
        if m.divisor_override is not None:
            raise ex.unsupported(node, "AvgPool2d with divisor_override")
        if not m.count_include_pad and any(pad):
            raise ex.unsupported(
                node,
                "AvgPool2d(count_include_pad=False) with padding: Caffe divides by the window "
                "clipped to the padded input, padding included",
            )
    in_hw, out_hw = ex.shape(node.args[0])[2:], ex.shape(node)[2:]
    clip = pad != (0, 0)
    caffe_hw = tuple(
        pooled_size(i, k, s, q, True, clip) for i, k, s, q in zip(in_hw, kernel, stride, pad)
    )
    if any(c < o for c, o in zip(caffe_hw, out_hw)):
        raise ex.unsupported(
            node,
            f"{type(m).__name__} whose output size {tuple(out_hw)} for input {tuple(in_hw)} "
            f"exceeds Caffe's {caffe_hw}",
        )
    extra = caffe_hw != tuple(out_hw)
    lp = ex.layer(node, "Pooling", [bottom], suffix="/ceil" if extra else "", last=not extra)
    p = lp.pooling_param
    p.pool = PP.MAX if is_max else PP.AVE
    set_hw(p, "kernel", kernel, None)
    set_hw(p, "stride", stride, 1)
    set_hw(p, "pad", pad, 0)
    if extra:
        _crop_trailing(ex, node, lp.top[0], caffe_hw, tuple(out_hw))


def _crop_trailing(
    ex: _Exporter, node: fx.Node, blob: str, have: tuple[int, ...], want: tuple[int, ...]
) -> None:
    """Drop the trailing rows/columns of Caffe's ceil-rounded pooling (torch floors): its
    first windows are torch's, so slicing them off is exact. Slice + Silence are BVLC layers
    every Caffe and OpenCV read, unlike the later ``round_mode`` field."""
    axes = [a for a, (h, w) in enumerate(zip(have, want)) if h != w]
    for n, a in enumerate(axes):
        last = n == len(axes) - 1
        sp = ex.layer(node, "Slice", [blob], suffix="" if last else f"/crop{a}", last=last)
        sp.slice_param.axis = 2 + a
        sp.slice_param.slice_point.append(want[a])
        rest = ex.unique(sp.name + "/dropped")
        sp.top.append(rest)
        silence = ex.net.layer.add(name=ex.unique(rest + "/silence"), type="Silence")
        silence.bottom.append(rest)
        blob = sp.top[0]


def _adaptive_pool(ex: _Exporter, node: fx.Node, m: Any, bottom: str) -> None:
    in_hw = ex.shape(node.args[0])[2:]
    out_hw = ex.shape(node)[2:]
    method = PP.MAX if isinstance(m, nn.AdaptiveMaxPool2d) else PP.AVE
    if tuple(out_hw) == tuple(in_hw):
        return ex.alias(node, bottom)
    if tuple(out_hw) == (1, 1):
        lp = ex.layer(node, "Pooling", [bottom])
        lp.pooling_param.pool = method
        lp.pooling_param.global_pooling = True
        return None
    if all(i % o == 0 for i, o in zip(in_hw, out_hw)):
        lp = ex.layer(node, "Pooling", [bottom])
        lp.pooling_param.pool = method
        step = (in_hw[0] // out_hw[0], in_hw[1] // out_hw[1])
        set_hw(lp.pooling_param, "kernel", step, None)
        set_hw(lp.pooling_param, "stride", step, 1)
        return None
    raise ex.unsupported(
        node,
        f"{type(m).__name__} from {tuple(in_hw)} to {tuple(out_hw)} (not a whole-number window)",
    )


def _identity(ex: _Exporter, node: fx.Node, m: Any, bottom: str) -> None:
    ex.alias(node, bottom)


def _flatten(ex: _Exporter, node: fx.Node, m: nn.Flatten, bottom: str) -> None:
    ndim = len(ex.shape(node.args[0]))
    start, end = m.start_dim % ndim, m.end_dim % ndim
    if start >= end:
        return ex.alias(node, bottom)
    lp = ex.layer(node, "Flatten", [bottom])
    if start != 1:
        lp.flatten_param.axis = start
    if end != ndim - 1:
        lp.flatten_param.end_axis = end
    return None


def _softmax(ex: _Exporter, node: fx.Node, m: nn.Softmax, bottom: str) -> None:
    if m.dim is None:
        raise ex.unsupported(node, "Softmax without dim")
    axis = m.dim % len(ex.shape(node))
    lp = ex.layer(node, "Softmax", [bottom])
    if axis != 1:
        lp.softmax_param.axis = axis


def _upsample(ex: _Exporter, node: fx.Node, m: nn.Upsample, bottom: str) -> None:
    src, out = ex.shape(node.args[0]), ex.shape(node)
    if len(src) != 4:
        raise ex.unsupported(node, f"{type(m).__name__} on a {len(src)}-D input")
    (ih, iw), (oh, ow) = src[2:], out[2:]
    if m.mode == "nearest":
        if oh % ih or ow % iw:
            raise ex.unsupported(
                node, f"nearest upsampling from {(ih, iw)} to {(oh, ow)} (not a whole factor)"
            )
        scale = (oh // ih, ow // iw)
        # A depthwise Deconvolution of ones (kernel = stride = scale) is nearest upsampling,
        # exactly: BVLC, and read by OpenCV, which has no fork Upsample layer.
        channels = src[1]
        weight = torch.ones(channels, 1, *scale)
        lp = ex.layer(node, "Deconvolution", [bottom], blobs=[weight])
        cp = lp.convolution_param
        cp.num_output, cp.group, cp.bias_term = channels, channels, False
        set_hw(cp, "kernel", scale, None)
        set_hw(cp, "stride", scale, 1)
        return
    if m.mode == "bilinear":
        if m.align_corners:
            ex.fork_only(node, "Interp")
            lp = ex.layer(node, "Interp", [bottom])
            lp.interp_param.height, lp.interp_param.width = oh, ow
            return
        ex.fork_only(node, "BilinearInterpolate")
        lp = ex.layer(node, "BilinearInterpolate", [bottom])
        p = lp.bilinear_interpolate_param
        p.dst_h, p.dst_w, p.align_corners = oh, ow, False
        return
    raise ex.unsupported(node, f"{type(m).__name__} mode {m.mode!r}")


def _pixel_shuffle(ex: _Exporter, node: fx.Node, m: nn.PixelShuffle, bottom: str) -> None:
    ex.fork_only(node, "PixelShuffle")
    lp = ex.layer(node, "PixelShuffle", [bottom])
    lp.pixelshuffle_param.upscale_factor = int(m.upscale_factor)


_MODULE_HANDLERS: list[tuple[type[nn.Module], Handler]] = [
    (nn.Conv2d, _conv),
    (nn.ConvTranspose2d, _deconv),
    (nn.Linear, _linear),
    (nn.BatchNorm2d, _batch_norm),
    (nn.BatchNorm1d, _batch_norm),
    (nn.ReLU, _neuron("ReLU")),
    (nn.LeakyReLU, _leaky_relu),
    (nn.PReLU, _prelu),
    (nn.Sigmoid, _neuron("Sigmoid")),
    (nn.Tanh, _neuron("TanH")),
    (nn.ELU, _elu),
    (nn.Hardtanh, _hardtanh),  # ReLU6 is a Hardtanh(0, 6)
    (nn.Hardswish, _hardswish),
    (nn.SiLU, _neuron("Swish")),  # BVLC's Swish, x * sigmoid(beta x) at its beta 1
    (nn.Softplus, _softplus),
    (_Unsupported, _unsupported),
    (nn.ConstantPad2d, _pad_module),  # ZeroPad2d is one
    (nn.ReflectionPad2d, _pad_module),
    (nn.ReplicationPad2d, _pad_module),
    (nn.Hardsigmoid, _hardsigmoid),
    (nn.MaxPool2d, _pool),
    (nn.AvgPool2d, _pool),
    (nn.AdaptiveAvgPool2d, _adaptive_pool),
    (nn.AdaptiveMaxPool2d, _adaptive_pool),
    (nn.Dropout, _identity),
    (nn.Dropout2d, _identity),
    (nn.Identity, _identity),
    (nn.Flatten, _flatten),
    (nn.Softmax, _softmax),
    (nn.Upsample, _upsample),
    (nn.PixelShuffle, _pixel_shuffle),
]


def module_handler(mod: nn.Module) -> Handler | None:
    for cls, handler in _MODULE_HANDLERS:
        # a subclass with its own forward computes something else: not this handler's op
        if isinstance(mod, cls) and type(mod).forward is cls.forward:
            return handler
    return None
