"""PyTorch -> Caffe: trace a module with torch.fx and write a deploy prototxt + caffemodel.

The graph is traced symbolically (``torch.nn`` modules stay leaves), shapes come from one run
on the example input (fx's ShapeProp), and every node becomes Caffe layers from the BVLC
catalogue, or from the fork layers torchcaffe already runs (ReLU6, HardSwish, HardSigmoid,
Interp, BilinearInterpolate, PixelShuffle) unless ``strict_bvlc``. This module walks the
graph; ``torch_layers`` holds the per-op mapping. The net is then compiled
by torchcaffe, filled with the module's tensors, checked against the module on the example
input, and written atomically. A TorchNet (a net torchcaffe compiled) is written back as it
is: its NetParameter and its params, nothing traced.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from ..errors import ExportError
from ..formats.caffemodel import save_caffemodel
from ..formats.prototxt import write_text
from ..net.net import TorchNet
from ..proto import caffe_pb2
from .torch_layers import (
    FUNCTION_LAYERS,
    FUNCTION_MODULES,
    METHOD_LAYERS,
    METHOD_MODULES,
    module_handler,
)

PathLike = str | os.PathLike
PP = caffe_pb2.PoolingParameter
EP = caffe_pb2.EltwiseParameter
RP = caffe_pb2.ReductionParameter
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
        self.owner: dict[int, tuple[caffe_pb2.LayerParameter, int]] = {}  # id(Parameter)
        self.graph = _Graph()

    # -- driver
    def run(self) -> tuple[caffe_pb2.NetParameter, dict[str, list[torch.Tensor]], _Graph]:
        root = self.module
        if module_handler(root) is not None:  # a bare layer: trace it as a leaf, not inside
            root = nn.Sequential()
            root.add_module(type(self.module).__name__.lower(), self.module)
        try:
            gm = fx.symbolic_trace(root)
        except Exception as err:  # fx raises many kinds; say what failed and why
            raise ExportError(
                f"torch.fx cannot trace {type(self.module).__name__}: {err}",
                hint="data-dependent control flow must be removed or wrapped in a leaf module",
            ) from None
        try:
            with torch.no_grad():
                _ValueProp(gm).propagate(*self.inputs)
        except Exception as err:  # the module's own error, e.g. an input of the wrong shape
            shapes = [tuple(x.shape) for x in self.inputs if isinstance(x, torch.Tensor)]
            raise ExportError(
                f"running {type(self.module).__name__} on the example input failed: "
                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                got=f"example input shapes {shapes}",
            ) from None
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
            self._follow_in_place(node)
        self._expose_outputs()
        return self.net, self.blobs, self.graph

    def _expose_outputs(self) -> None:
        """Caffe's net outputs are the blobs no later layer consumes (an in-place layer's top
        stays one, as in Net::Init): a module output that a later layer also reads (or an
        input returned as is) gets a Split copy, ``<blob>/output``."""
        available: set[str] = set()
        for lp in self.net.layer:
            available.difference_update(lp.bottom)
            available.update(lp.top)
        inputs = {lp.top[0] for lp in self.net.layer if lp.type == "Input"}
        for i, blob in enumerate(self.graph.output_blobs):
            if blob not in available or blob in inputs:
                name = self.unique(f"{blob}/output")
                lp = self.net.layer.add(name=name, type="Split")
                lp.bottom.append(blob)
                lp.top.append(name)
                self.graph.output_blobs[i] = name

    def _follow_in_place(self, node: fx.Node) -> None:
        """An op that writes its first input in place (``y.add_(x)``, ``relu_``, a module or
        functional call with ``inplace=True``) changed that tensor: later readers of the
        input's fx node get the op's blob, as the module reads the mutated tensor."""
        first = node.args[0] if node.args else None
        if node not in self.top or not isinstance(first, fx.Node) or first not in self.top:
            return
        in_place = node.kwargs.get("inplace", False) is True
        if node.op == "call_method":
            in_place = str(node.target).endswith("_")
        elif node.op == "call_module":
            in_place = getattr(self.modules[str(node.target)], "inplace", False) is True
        elif node.op == "call_function" and node.target in _IN_PLACE_OPERATORS:
            in_place = True
        if in_place:
            self.top[first] = self.top[node]

    def _node(self, node: fx.Node) -> None:
        if node.op == "placeholder":
            self._input(node)
        elif node.op == "output":
            for value in _flat_nodes(node.args[0]):
                self.graph.output_blobs.append(self.blob(value, node))
        elif node.op == "call_module" and module_handler(self.modules[str(node.target)]) is None:
            mod = self.modules[str(node.target)]
            raise self.unsupported(node, f"module {type(mod).__module__}.{type(mod).__name__}")
        elif not self.is_tensor(node):
            return  # sizes, shapes, python values: read through ShapeProp where they matter
        elif node.op == "call_module":
            mod = self.modules[str(node.target)]
            handler = module_handler(mod)
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
            self._share(lp, blobs)
        if last:
            self.top[node] = name
        return lp

    def _share(self, lp: caffe_pb2.LayerParameter, blobs: Sequence[torch.Tensor]) -> None:
        """A Parameter already written by an earlier layer (a module called twice) is shared
        as Caffe shares params: the same ParamSpec name on both layers."""
        for i, blob in enumerate(blobs):
            if not isinstance(blob, nn.Parameter):
                continue
            first = self.owner.get(id(blob))
            if first is None:
                self.owner[id(blob)] = (lp, i)
                continue
            owner, j = first
            spec = f"{owner.name}/{j}"
            for layer, k in ((owner, j), (lp, i)):
                while len(layer.param) <= k:
                    layer.param.add()
                layer.param[k].name = spec

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
        maker = FUNCTION_MODULES.get(fn)
        if maker is not None:
            mod = maker(args[1:], kwargs)
            if mod is None:
                return self.alias(node, self.blob(args[0], node))
            handler = module_handler(mod)
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
        if fn in (operator.neg, torch.neg):
            return self._binary(node, [args[0], -1.0], {}, "mul")
        if fn in FUNCTION_LAYERS:
            self.layer(node, FUNCTION_LAYERS[fn], [self.blob(args[0], node)])
            return None
        if fn in (operator.pow, torch.pow):
            return self._power(node, args[0], args[1] if len(args) > 1 else kwargs.get("exponent"))
        if fn is torch.maximum or (fn is torch.max and len(args) == 2 and self.is_tensor(args[1])):
            return self._eltwise_max(node, args[0], args[1])
        if fn is operator.getitem and self.is_tensor(args[0]):
            return self._slice(node, args[0], args[1])
        if fn is torch.transpose:
            return self._transpose(node, args[0], args[1], args[2])
        if fn is torch.permute:
            return self._permute(node, args[0], args[1] if len(args) > 1 else kwargs["dims"])
        if fn in (torch.cat, torch.concat):
            return self._cat(node, args, kwargs)
        if fn is torch.mean:
            return self._mean(node, args, kwargs)
        if fn is torch.sum:
            return self._reduce(node, args, kwargs, RP.SUM)
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
        if name == "sum":
            return self._reduce(node, args, kwargs, RP.SUM)
        if name in ("contiguous", "clone", "detach"):
            return self.alias(node, self.blob(args[0], node))
        if name in ("add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_"):
            return self._binary(node, args, kwargs, name.rstrip("_"))
        if name in METHOD_LAYERS:
            self.layer(node, METHOD_LAYERS[name], [self.blob(args[0], node)])
            return None
        if name == "transpose":
            return self._transpose(node, args[0], args[1], args[2])
        if name == "permute":
            dims = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list)) else args[1:]
            return self._permute(node, args[0], dims or kwargs["dims"])
        if name == "pow":
            return self._power(node, args[0], args[1] if len(args) > 1 else kwargs.get("exponent"))
        maker = METHOD_MODULES.get(name)
        if maker is not None:
            mod = maker(args[1:], kwargs)
            handler = module_handler(mod)
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
        if self.is_tensor(b) and isinstance(a, (int, float)) and op in ("add", "mul", "sub"):
            if op == "sub":  # c - x = -1 * x + c
                lp = self.layer(node, "Power", [self.blob(b, node)])
                lp.power_param.scale, lp.power_param.shift = -1.0, float(a)
                return None
            a, b = b, a  # scalar op tensor, commutative
        if not self.is_tensor(a) or not isinstance(b, (int, float)):
            what = "a number and a tensor" if self.is_tensor(b) else type(b).__name__
            raise self.unsupported(node, f"{_describe(node)} on {what}")
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

    def _power(self, node: fx.Node, base: Any, exponent: Any) -> None:
        """A tensor to a number's power: Caffe's Power layer at scale 1, shift 0."""
        if not self.is_tensor(base) or not isinstance(exponent, (int, float)):
            raise self.unsupported(node, f"{_describe(node)} other than a tensor to a number")
        self.layer(node, "Power", [self.blob(base, node)]).power_param.power = float(exponent)

    def _permute(self, node: fx.Node, source: Any, dims: Any) -> None:
        """An axis permutation: the SSD fork's Permute with the whole order."""
        order = [int(d) % len(self.shape(source)) for d in dims]
        if order == sorted(order):
            return self.alias(node, self.blob(source, node))
        self.fork_only(node, "Permute")
        lp = self.layer(node, "Permute", [self.blob(source, node)])
        lp.permute_param.order.extend(order)
        return None

    def _value(self, value: Any) -> Any:
        """``value``, or what the example run computed for it where it is a node."""
        if isinstance(value, fx.Node):
            return value.meta.get("value", value)
        return value

    def _transpose(self, node: fx.Node, source: Any, a: int, b: int) -> None:
        order = list(range(len(self.shape(source))))
        order[a], order[b] = order[b], order[a]
        return self._permute(node, source, order)

    def _slice(self, node: fx.Node, source: Any, index: Any) -> None:
        """``x[:, a:b]`` (one axis, step 1, the others whole): a Slice at a and b, its other
        parts to a Silence. Steps, integers, None and ellipses have no Caffe form."""
        shape = self.shape(source)
        index = tuple(
            slice(*(self._value(v) for v in (i.start, i.stop, i.step)))
            if isinstance(i, slice)
            else i
            for i in (index if isinstance(index, tuple) else (index,))
        )
        full = slice(None, None, None)
        cut = [(axis, i) for axis, i in enumerate(index) if i != full]
        if len(index) > len(shape) or len(cut) != 1 or not isinstance(cut[0][1], slice):
            raise self.unsupported(node, f"indexing {index!r} (one axis sliced by a:b only)")
        axis, part = cut[0]
        if part.step not in (None, 1):
            raise self.unsupported(node, f"indexing {index!r} with a step")
        start, stop, _ = part.indices(shape[axis])
        if start >= stop:
            raise self.unsupported(node, f"indexing {index!r}: an empty slice")
        points = [p for p in (start, stop) if 0 < p < shape[axis]]
        if not points:
            return self.alias(node, self.blob(source, node))
        lp = self.layer(node, "Slice", [self.blob(source, node)])
        lp.slice_param.axis = axis
        lp.slice_param.slice_point.extend(points)
        kept = lp.top[0]
        lp.ClearField("top")
        for n, begin in enumerate([0, *points]):
            if begin == start:
                lp.top.append(kept)
            else:
                rest = self.unique(f"{kept}/dropped{n}")
                lp.top.append(rest)
                silence = self.net.layer.add(name=self.unique(rest + "/silence"), type="Silence")
                silence.bottom.append(rest)
        return None

    def _eltwise_max(self, node: fx.Node, a: Any, b: Any) -> None:
        """The element-wise maximum of two tensors of one shape: Eltwise MAX."""
        if not (self.is_tensor(a) and self.is_tensor(b)) or self.shape(a) != self.shape(b):
            raise self.unsupported(node, f"{_describe(node)} other than of two equal shapes")
        lp = self.layer(node, "Eltwise", [self.blob(a, node), self.blob(b, node)])
        lp.eltwise_param.operation = EP.MAX

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
        """mean over both spatial axes of (N, C, H, W): global average pooling; over other
        trailing axes a Reduction."""
        src = args[0]
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        shape = self.shape(src)
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        if len(shape) != 4 or sorted(d % 4 for d in dims) != [2, 3]:
            return self._reduce(node, args, kwargs, RP.MEAN)
        lp = self.layer(
            node, "Pooling", [self.blob(src, node)], suffix="" if keep else "/pool", last=keep
        )
        lp.pooling_param.pool = PP.AVE
        lp.pooling_param.global_pooling = True
        if not keep:
            self.layer(node, "Flatten", [lp.top[0]])

    def _reduce(self, node: fx.Node, args: list, kwargs: dict, op: Any) -> None:
        """sum or mean over the trailing axes from some axis on (all of them without ``dim``):
        Caffe's Reduction, whose top keeps the axes before it; a ``keepdim`` top adds a
        Reshape that puts the reduced axes back as 1s."""
        src = args[0]
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        if kwargs.get("dtype") is not None:
            raise self.unsupported(node, f"{_describe(node)} with a dtype")
        shape = self.shape(src)
        ndim = len(shape)
        axes = (
            sorted({d % ndim for d in ([dims] if isinstance(dims, int) else dims)})
            if (dims is not None)
            else list(range(ndim))
        )
        if not axes or axes != list(range(axes[0], ndim)):
            raise self.unsupported(
                node, f"{_describe(node)} over dims {dims} of {shape} (Caffe reduces trailing axes)"
            )
        suffix = "/reduce" if keep else ""
        lp = self.layer(node, "Reduction", [self.blob(src, node)], suffix=suffix, last=not keep)
        lp.reduction_param.operation = op
        if axes[0]:
            lp.reduction_param.axis = axes[0]
        if keep:
            rp = self.layer(node, "Reshape", [lp.top[0]])
            # 0 copies the kept axes from the Reduction's top: any batch, as _reshape writes it
            rp.reshape_param.shape.dim.extend([0] * axes[0] + [1] * len(axes))
        return None

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
        if len(out) == 2 and len(src) > 2 and out[0] == src[0]:  # (a 1-D one unsqueezes)
            self.layer(node, "Flatten", [bottom])
            return None
        lp = self.layer(node, "Reshape", [bottom])
        # the batch kept: 0 copies it; folded in (x.view(-1), x.view(-1, k)): -1 infers it,
        # so the net runs at any batch as the module does
        dims = [0, *out[1:]] if out[0] == src[0] else [-1, *out[1:]]
        lp.reshape_param.shape.dim.extend(dims)
        return None


_IN_PLACE_OPERATORS = (operator.iadd, operator.isub, operator.imul, operator.itruediv)


class _ValueProp(ShapeProp):
    """fx's ShapeProp that also keeps each node's plain Python value (``x.shape[1] // 2``
    as a slice bound), under ``meta["value"]``."""

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, (int, float, bool)):
            n.meta["value"] = result
        return result


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
