"""PyTorch -> Caffe: trace a module with torch.fx and write a deploy prototxt + caffemodel.

The graph is traced symbolically (``torch.nn`` modules stay leaves), shapes come from one run
on the example input (fx's ShapeProp), and every node becomes Caffe layers from the BVLC
catalogue, or from the fork layers torchcaffe already runs (ReLU6, HardSwish, Upsample,
Interp, BilinearInterpolate, PixelShuffle) unless ``strict_bvlc``. The net is then compiled
by torchcaffe, filled with the module's tensors, checked against the module on the example
input, and written atomically. A TorchNet (a net torchcaffe compiled) is written back as it
is: its NetParameter and its params, nothing traced.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from ..errors import ExportError
from ..formats.caffemodel import save_caffemodel
from ..formats.prototxt import write_text
from ..net.net import TorchNet
from ..ops.pooling import pooled_size
from ..proto import caffe_pb2

PathLike = str | os.PathLike
PP = caffe_pb2.PoolingParameter
EP = caffe_pb2.EltwiseParameter
Shape = tuple[int, ...]


def export(
    module: nn.Module,
    example_input: torch.Tensor | Sequence[torch.Tensor] | None,
    prototxt_path: PathLike,
    caffemodel_path: PathLike,
    *,
    strict_bvlc: bool = False,
    input_names: Sequence[str] | None = None,
    check: bool = True,
) -> TorchNet:
    """Write ``module`` as a Caffe deploy net (prototxt) and its weights (caffemodel).

    ``example_input`` fixes the Input layer's shape (and pooling rounding, which depends on
    it; ignored for a TorchNet). ``strict_bvlc`` keeps to layers BVLC Caffe has (fork layers
    become errors, nearest upsampling a fixed Deconvolution). With ``check`` the compiled
    Caffe net is run on the example and must agree with the module. Returns that compiled
    net (a TorchNet).
    """
    if isinstance(module, TorchNet):
        write_text(module.net_param, prototxt_path)
        save_caffemodel(module, caffemodel_path)
        return module
    if example_input is None:
        raise ExportError("an example input is needed to trace a torch module", got=None)
    inputs = (example_input,) if isinstance(example_input, torch.Tensor) else tuple(example_input)
    was_training = module.training
    module.eval()
    try:
        net_param, blobs, graph = _Exporter(module, inputs, strict_bvlc, input_names).run()
        net = _compile(net_param, blobs)
        if check:
            _check(module, net, inputs, graph)
    finally:
        module.train(was_training)
    write_text(net_param, prototxt_path)
    save_caffemodel(net, caffemodel_path)
    return net


def to_net_parameter(
    module: nn.Module,
    example_input: torch.Tensor | Sequence[torch.Tensor],
    *,
    strict_bvlc: bool = False,
    input_names: Sequence[str] | None = None,
) -> tuple[caffe_pb2.NetParameter, dict[str, list[torch.Tensor]]]:
    """The Caffe net of ``module`` and its param blobs by layer name (Caffe blob order)."""
    inputs = (example_input,) if isinstance(example_input, torch.Tensor) else tuple(example_input)
    net_param, blobs, _ = _Exporter(module, inputs, strict_bvlc, input_names).run()
    return net_param, blobs


# -- compile, fill, check -----------------------------------------------------------------------
@torch.no_grad()
def _compile(net_param: caffe_pb2.NetParameter, blobs: dict[str, list[torch.Tensor]]) -> TorchNet:
    net = TorchNet(net_param, caffe_pb2.TEST)
    for name, tensors in blobs.items():
        targets = net.layer(name).param_blobs()
        if len(targets) != len(tensors):
            raise ExportError(
                "exported blob count does not fit the Caffe layer",
                layer=name,
                expected=len(targets),
                got=len(tensors),
            )
        for target, source in zip(targets, tensors):
            if target.numel() != source.numel():
                raise ExportError(
                    "exported blob size does not fit the Caffe layer",
                    layer=name,
                    expected=tuple(target.shape),
                    got=tuple(source.shape),
                )
            target.copy_(source.detach().reshape(target.shape).to(target.dtype))
    return net


@torch.no_grad()
def _check(module: nn.Module, net: TorchNet, inputs: tuple, graph: _Graph) -> None:
    want_list = [t.detach().cpu().float() for t in _flat_tensors(module(*inputs))]
    feed = {n: x.detach().cpu().float() for n, x in zip(net.input_names, inputs)}  # net: CPU
    got = net.forward_all_blobs(**feed)
    for blob, ref in zip(graph.output_blobs, want_list):
        out = got[blob]
        scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
        diff = float((out - ref).abs().max()) if ref.numel() else 0.0
        if out.shape != ref.shape or diff > 1e-4 * scale:
            raise ExportError(
                f"the exported Caffe net disagrees with the module on output blob '{blob}'",
                expected=f"shape {tuple(ref.shape)}, max abs diff <= {1e-4 * scale:.3g}",
                got=f"shape {tuple(out.shape)}, max abs diff {diff:.3g}",
                hint="please report this with the module; pass check=False to write anyway",
            )


def _flat_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat_tensors(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat_tensors(v)]
    return []


# -- tracing --------------------------------------------------------------------------------------
class _Graph:
    def __init__(self) -> None:
        self.output_blobs: list[str] = []


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        return (int(v[0]), int(v[1])) if len(v) == 2 else (int(v[0]), int(v[0]))
    return (int(v), int(v))


def _set_hw(msg: Any, field: str, value: tuple[int, int], default: int | None) -> None:
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


class _Exporter:
    def __init__(
        self,
        module: nn.Module,
        inputs: tuple,
        strict_bvlc: bool,
        input_names: Sequence[str] | None,
    ) -> None:
        self.module = module
        self.inputs = inputs
        self.strict = strict_bvlc
        self.input_names = list(input_names) if input_names else None
        self.net = caffe_pb2.NetParameter(name=type(module).__name__)
        self.blobs: dict[str, list[torch.Tensor]] = {}
        self.top: dict[fx.Node, str] = {}
        self.used: set[str] = set()
        self.graph = _Graph()

    # -- driver
    def run(self) -> tuple[caffe_pb2.NetParameter, dict[str, list[torch.Tensor]], _Graph]:
        root = self.module
        if _module_handler(root) is not None:  # a bare layer: trace it as a leaf, not inside
            root = nn.Sequential()
            root.add_module(type(self.module).__name__.lower(), self.module)
        try:
            gm = fx.symbolic_trace(root)
        except Exception as err:  # fx raises many kinds; say what failed and why
            raise ExportError(
                f"torch.fx cannot trace {type(self.module).__name__}: {err}",
                hint="data-dependent control flow must be removed or wrapped in a leaf module",
            ) from None
        with torch.no_grad():
            ShapeProp(gm).propagate(*self.inputs)
        self.modules = dict(gm.named_modules())
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if self.input_names is not None and len(self.input_names) != len(placeholders):
            raise ExportError(
                "input_names does not match the module's inputs",
                expected=len(placeholders),
                got=len(self.input_names),
            )
        for node in gm.graph.nodes:
            self._node(node)
        return self.net, self.blobs, self.graph

    def _node(self, node: fx.Node) -> None:
        if node.op == "placeholder":
            self._input(node)
        elif node.op == "output":
            for value in _flat_nodes(node.args[0]):
                self.graph.output_blobs.append(self.blob(value, node))
        elif node.op == "call_module" and _module_handler(self.modules[str(node.target)]) is None:
            mod = self.modules[str(node.target)]
            raise self.unsupported(node, f"module {type(mod).__module__}.{type(mod).__name__}")
        elif not self.is_tensor(node):
            return  # sizes, shapes, python values: read through ShapeProp where they matter
        elif node.op == "call_module":
            mod = self.modules[str(node.target)]
            handler = _module_handler(mod)
            assert handler is not None
            handler(self, node, mod, self.blob(node.args[0], node))
        elif node.op == "call_function":
            self._function(node, node.target, list(node.args), dict(node.kwargs))
        elif node.op == "call_method":
            self._method(node, str(node.target), list(node.args), dict(node.kwargs))
        else:
            raise self.unsupported(node, f"{node.op} {node.target}")

    # -- helpers
    def is_tensor(self, node: Any) -> bool:
        return isinstance(node, fx.Node) and isinstance(
            node.meta.get("tensor_meta"), TensorMetadata
        )

    def shape(self, node: Any) -> Shape:
        return tuple(int(d) for d in node.meta["tensor_meta"].shape)

    def blob(self, value: Any, user: fx.Node) -> str:
        if not isinstance(value, fx.Node) or value not in self.top:
            raise self.unsupported(
                user, f"{_describe(user)} on a non-tensor or constant input ({value!r})"
            )
        return self.top[value]

    def unsupported(self, node: fx.Node, what: str) -> ExportError:
        return ExportError(
            f"unsupported op {what} at node '{node.name}'",
            hint="see docs/converters.md for the ops the exporter maps to Caffe layers",
        )

    def fork_only(self, node: fx.Node, layer_type: str, alternative: str = "") -> None:
        if self.strict:
            raise ExportError(
                f"{_describe(node)} at node '{node.name}' needs the fork layer '{layer_type}', "
                "which BVLC Caffe does not have (strict_bvlc=True)",
                hint=alternative or "export without strict_bvlc to use the fork layer",
            )

    def unique(self, base: str) -> str:
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name

    def layer(
        self,
        node: fx.Node,
        type_: str,
        bottoms: Sequence[str],
        *,
        suffix: str = "",
        blobs: Sequence[torch.Tensor] = (),
        last: bool = True,
    ) -> caffe_pb2.LayerParameter:
        """Append a layer whose top is its own name; ``last`` makes it the node's value."""
        base = str(node.target) if node.op == "call_module" else node.name
        name = self.unique(base + suffix)
        lp = self.net.layer.add(name=name, type=type_)
        lp.bottom.extend(bottoms)
        lp.top.append(name)
        if blobs:
            self.blobs[name] = [b.detach().cpu() for b in blobs]
        if last:
            self.top[node] = name
        return lp

    def alias(self, node: fx.Node, blob: str) -> None:
        self.top[node] = blob

    # -- node kinds
    def _input(self, node: fx.Node) -> None:
        index = sum(1 for n in self.top if n.op == "placeholder")
        if self.input_names is not None:
            name = self.input_names[index]
        else:
            name = "data" if len(self.inputs) == 1 else str(node.target)
        name = self.unique(name)
        lp = self.net.layer.add(name=name, type="Input")
        lp.top.append(name)
        lp.input_param.shape.add().dim.extend(self.shape(node))
        self.top[node] = name

    def _function(self, node: fx.Node, fn: Any, args: list, kwargs: dict) -> None:
        maker = _FUNCTION_MODULES.get(fn)
        if maker is not None:
            mod = maker(args[1:], kwargs)
            if mod is None:
                return self.alias(node, self.blob(args[0], node))
            handler = _module_handler(mod)
            assert handler is not None
            return handler(self, node, mod, self.blob(args[0], node))
        if fn in (operator.add, torch.add, operator.iadd):
            return self._binary(node, args, kwargs, "add")
        if fn in (operator.sub, torch.sub, operator.isub):
            return self._binary(node, args, kwargs, "sub")
        if fn in (operator.mul, torch.mul, operator.imul):
            return self._binary(node, args, kwargs, "mul")
        if fn in (operator.truediv, torch.div):
            return self._binary(node, args, kwargs, "div")
        if fn in (torch.cat, torch.concat):
            return self._cat(node, args, kwargs)
        if fn is torch.mean:
            return self._mean(node, args, kwargs)
        if fn in (torch.reshape,):
            return self._reshape(node, args[0])
        if fn is F.dropout or fn is F.dropout2d:
            return self.alias(node, self.blob(args[0], node))
        raise self.unsupported(node, _describe(node))

    def _method(self, node: fx.Node, name: str, args: list, kwargs: dict) -> None:
        if name in ("view", "reshape"):
            return self._reshape(node, args[0])
        if name == "mean":
            return self._mean(node, args, kwargs)
        if name in ("contiguous", "clone", "detach"):
            return self.alias(node, self.blob(args[0], node))
        if name in ("add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_"):
            return self._binary(node, args, kwargs, name.rstrip("_"))
        maker = _METHOD_MODULES.get(name)
        if maker is not None:
            mod = maker(args[1:], kwargs)
            handler = _module_handler(mod)
            assert handler is not None
            return handler(self, node, mod, self.blob(args[0], node))
        raise self.unsupported(node, _describe(node))

    def _binary(self, node: fx.Node, args: list, kwargs: dict, op: str) -> None:
        a, b = args[0], args[1] if len(args) > 1 else kwargs.get("other")
        if kwargs.get("alpha", 1) != 1:
            raise self.unsupported(node, f"{_describe(node)} with alpha")
        if self.is_tensor(a) and self.is_tensor(b):
            if op in ("mul", "add") and self._channel_broadcast(node, a, b, op):
                return None
            if self.shape(a) != self.shape(b):
                raise self.unsupported(
                    node,
                    f"{_describe(node)} with broadcasting ({self.shape(a)} and {self.shape(b)})",
                )
            if op == "div":
                raise self.unsupported(node, f"{_describe(node)} of two tensors")
            lp = self.layer(node, "Eltwise", [self.blob(a, node), self.blob(b, node)])
            if op == "mul":
                lp.eltwise_param.operation = EP.PROD
            elif op == "sub":
                lp.eltwise_param.coeff.extend([1.0, -1.0])
            return None
        if self.is_tensor(b) and op in ("add", "mul"):
            a, b = b, a  # scalar op tensor, commutative
        if not self.is_tensor(a) or not isinstance(b, (int, float)):
            raise self.unsupported(node, f"{_describe(node)} on {type(b).__name__}")
        lp = self.layer(node, "Power", [self.blob(a, node)])
        p = lp.power_param
        if op == "add":
            p.shift = float(b)
        elif op == "sub":
            p.shift = -float(b)
        elif op == "mul":
            p.scale = float(b)
        else:
            p.scale = 1.0 / float(b)
        return None

    def _channel_broadcast(self, node: fx.Node, a: Any, b: Any, op: str) -> bool:
        """(N, C, H, W) times/plus (N, C, 1, 1), as in squeeze-excitation: Flatten the small
        one to (N, C), then Scale/Bias with two bottoms (axis 0) applies it per channel."""
        sa, sb = self.shape(a), self.shape(b)
        if len(sa) != 4 or len(sb) != 4:
            return False
        if sb[:2] != sa[:2] or sb[2:] != (1, 1):
            if sa[:2] == sb[:2] and sa[2:] == (1, 1) and sb[2:] != (1, 1):
                a, b, sa, sb = b, a, sb, sa
            else:
                return False
        if sa == sb:
            return False
        flat = self.layer(node, "Flatten", [self.blob(b, node)], suffix="/flatten", last=False)
        lp = self.layer(node, "Scale" if op == "mul" else "Bias", [self.blob(a, node), flat.top[0]])
        (lp.scale_param if op == "mul" else lp.bias_param).axis = 0
        return True

    def _mean(self, node: fx.Node, args: list, kwargs: dict) -> None:
        """mean over both spatial axes of (N, C, H, W): global average pooling."""
        src = args[0]
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        shape = self.shape(src)
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        if len(shape) != 4 or sorted(d % 4 for d in dims) != [2, 3]:
            raise self.unsupported(node, f"{_describe(node)} over dims {dims} of {shape}")
        lp = self.layer(
            node, "Pooling", [self.blob(src, node)], suffix="" if keep else "/pool", last=keep
        )
        lp.pooling_param.pool = PP.AVE
        lp.pooling_param.global_pooling = True
        if not keep:
            self.layer(node, "Flatten", [lp.top[0]])

    def _cat(self, node: fx.Node, args: list, kwargs: dict) -> None:
        tensors = args[0]
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        bottoms = [self.blob(t, node) for t in tensors]
        lp = self.layer(node, "Concat", bottoms)
        axis = dim % len(self.shape(node))
        if axis != 1:
            lp.concat_param.axis = axis

    def _reshape(self, node: fx.Node, source: fx.Node) -> None:
        bottom = self.blob(source, node)
        src, out = self.shape(source), self.shape(node)
        if src == out:
            return self.alias(node, bottom)
        if len(out) == 2 and out[0] == src[0]:
            self.layer(node, "Flatten", [bottom])
            return None
        lp = self.layer(node, "Reshape", [bottom])
        dims = [0, *out[1:]] if out[0] == src[0] else list(out)
        lp.reshape_param.shape.dim.extend(dims)
        return None


def _flat_nodes(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [n for v in value for n in _flat_nodes(v)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _flat_nodes(v)]
    return [value]


def _describe(node: fx.Node) -> str:
    if node.op == "call_function":
        target = node.target
        name = getattr(target, "__name__", str(target))
        mod = getattr(target, "__module__", None) or ""
        return f"function {mod + '.' if mod else ''}{name}"
    if node.op == "call_method":
        return f"method Tensor.{node.target}"
    return f"{node.op} {node.target}"


# -- functional calls as their module equivalents ---------------------------------------------
def _arg(args: list, kwargs: dict, i: int, key: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(key, default)


_FUNCTION_MODULES: dict[Any, Callable[[list, dict], nn.Module | None]] = {
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

_METHOD_MODULES: dict[str, Callable[[list, dict], nn.Module]] = {
    "relu": lambda a, k: nn.ReLU(),
    "sigmoid": lambda a, k: nn.Sigmoid(),
    "tanh": lambda a, k: nn.Tanh(),
    "flatten": lambda a, k: nn.Flatten(_arg(a, k, 0, "start_dim", 0), _arg(a, k, 1, "end_dim", -1)),
    "softmax": lambda a, k: nn.Softmax(_arg(a, k, 0, "dim", None)),
}


# -- modules ------------------------------------------------------------------------------------
Handler = Callable[["_Exporter", fx.Node, Any, str], None]


def _conv(ex: _Exporter, node: fx.Node, m: nn.Conv2d, bottom: str) -> None:
    if m.padding_mode != "zeros":
        raise ex.unsupported(node, f"Conv2d with padding_mode={m.padding_mode!r}")
    pad = _conv_padding(ex, node, m)
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
    return _pair(m.padding)


def _conv_param(cp: Any, m: Any, pad: tuple[int, int]) -> None:
    cp.num_output = m.out_channels
    if m.bias is None:
        cp.bias_term = False
    if m.groups != 1:
        cp.group = m.groups
    _set_hw(cp, "kernel", _pair(m.kernel_size), None)
    _set_hw(cp, "stride", _pair(m.stride), 1)
    _set_hw(cp, "pad", pad, 0)
    dilation = _pair(m.dilation)
    if dilation != (1, 1):
        cp.dilation.extend(dilation if dilation[0] != dilation[1] else dilation[:1])


def _deconv(ex: _Exporter, node: fx.Node, m: nn.ConvTranspose2d, bottom: str) -> None:
    if any(_pair(m.output_padding)):
        raise ex.unsupported(
            node, "ConvTranspose2d with output_padding (Caffe's Deconvolution has none)"
        )
    if m.padding_mode != "zeros":
        raise ex.unsupported(node, f"ConvTranspose2d with padding_mode={m.padding_mode!r}")
    blobs = [m.weight] + ([m.bias] if m.bias is not None else [])
    lp = ex.layer(node, "Deconvolution", [bottom], blobs=blobs)
    _conv_param(lp.convolution_param, m, _pair(m.padding))


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
    lp = ex.layer(
        node, "BatchNorm", [bottom], blobs=[m.running_mean, m.running_var, one], last=not m.affine
    )
    lp.batch_norm_param.use_global_stats = True
    lp.batch_norm_param.eps = float(m.eps)
    if m.affine:
        sp = ex.layer(node, "Scale", [lp.top[0]], suffix="/scale", blobs=[m.weight, m.bias])
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


def _pool(ex: _Exporter, node: fx.Node, m: Any, bottom: str) -> None:
    is_max = isinstance(m, nn.MaxPool2d)
    kernel = _pair(m.kernel_size)
    stride = _pair(m.stride if m.stride is not None else m.kernel_size)
    pad = _pair(m.padding)
    if is_max and (_pair(m.dilation) != (1, 1) or m.return_indices):
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
    _set_hw(p, "kernel", kernel, None)
    _set_hw(p, "stride", stride, 1)
    _set_hw(p, "pad", pad, 0)
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
        _set_hw(lp.pooling_param, "kernel", step, None)
        _set_hw(lp.pooling_param, "stride", step, 1)
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
        if oh % ih or ow % iw or oh // ih != ow // iw:
            raise ex.unsupported(node, f"nearest upsampling from {(ih, iw)} to {(oh, ow)}")
        scale = oh // ih
        # A depthwise Deconvolution of ones (kernel = stride = scale) is nearest upsampling,
        # exactly: BVLC, and read by OpenCV, which has no fork Upsample layer.
        channels = src[1]
        weight = torch.ones(channels, 1, scale, scale)
        lp = ex.layer(node, "Deconvolution", [bottom], blobs=[weight])
        cp = lp.convolution_param
        cp.num_output, cp.group, cp.bias_term = channels, channels, False
        cp.kernel_size.append(scale)
        cp.stride.append(scale)
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


def _module_handler(mod: nn.Module) -> Handler | None:
    for cls, handler in _MODULE_HANDLERS:
        # a subclass with its own forward computes something else: not this handler's op
        if isinstance(mod, cls) and type(mod).forward is cls.forward:
            return handler
    return None
