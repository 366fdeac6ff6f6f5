"""pycaffe's NetSpec: write nets in Python (``L.Convolution(n.data, num_output=20)``).

``layers`` (``L``) makes a layer function for any type name; its keyword arguments fill the
type's own ``<type>_param`` message first, else ``LayerParameter`` fields (``name``,
``include``, ``loss_weight``, ``param``); keys ending in ``param`` go to the layer directly.
``ntop`` sets the number of tops (0 returns the layer itself), ``in_place=True`` reuses the
bottom names as tops. Dicts fill nested messages, lists fill repeated fields (dicts in a list
add one message each). ``params`` (``P``) gives the enum values of ``<Type>Parameter``
(``P.Pooling.MAX``). Names: a top assigned to a NetSpec attribute takes that name and its
layer the name of its first top; others get ``<Type><count>``.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Any

from .errors import UsageError
from .proto import caffe_pb2

# Layer types whose parameter message is named after another type (Caffe's LayerParameter).
_PARAM_ALIASES = {"Deconvolution": "convolution", "Im2col": "convolution"}


def param_name_dict() -> dict[str, str]:
    """Layer type name -> its ``*_param`` field stem, from the message type of each field
    (``ConvolutionParameter`` -> ``Convolution`` -> ``convolution``), as pycaffe derives it."""
    layer = caffe_pb2.LayerParameter()
    out = {}
    for field in layer.DESCRIPTOR.fields:
        if field.name.endswith("_param") and field.message_type is not None:
            type_name = field.message_type.name
            if type_name.endswith("Parameter"):
                out[type_name[: -len("Parameter")]] = field.name[: -len("_param")]
    for type_name, stem in _PARAM_ALIASES.items():
        out.setdefault(type_name, stem)
    return out


_param_names = param_name_dict()


def assign_proto(proto: Any, name: str, val: Any) -> None:
    """Set field ``name`` of ``proto`` from a Python value: dicts fill a nested message, lists
    (or a scalar, for a repeated field) extend a repeated field, dicts in a list add messages."""
    is_repeated = hasattr(getattr(proto, name), "extend")
    if is_repeated and not isinstance(val, (list, tuple)):
        val = [val]
    if isinstance(val, (list, tuple)):
        if val and isinstance(val[0], dict):
            for item in val:
                message = getattr(proto, name).add()
                for k, v in item.items():
                    assign_proto(message, k, v)
        else:
            getattr(proto, name).extend(val)
    elif isinstance(val, dict):
        for k, v in val.items():
            assign_proto(getattr(proto, name), k, v)
    else:
        setattr(proto, name, val)


class Top:
    """One output of a layer function: an input to later layers."""

    def __init__(self, fn: Function, n: int) -> None:
        self.fn = fn
        self.n = n

    def to_proto(self) -> caffe_pb2.NetParameter:
        """The NetParameter of the layers this top depends on (auto-named)."""
        return to_proto(self)

    def _update(self, params: dict[str, Any]) -> None:
        self.fn._update(params)

    def _to_proto(self, layers: dict, names: dict, autonames: Counter) -> None:
        self.fn._to_proto(layers, names, autonames)


class Function:
    """One layer: its type, inputs (Tops) and keyword parameters."""

    def __init__(self, type_name: str, inputs: tuple, params: dict[str, Any]) -> None:
        self.type_name = type_name
        for index, inp in enumerate(inputs):
            if not isinstance(inp, Top):
                raise UsageError(f"{type_name} input {index} is not a Top (type is {type(inp)})")
        self.inputs = inputs
        self.params = dict(params)
        self.ntop = int(self.params.pop("ntop", 1))
        self.in_place = bool(self.params.pop("in_place", False))
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _get_name(self, names: dict, autonames: Counter) -> str:
        if self not in names and self.ntop > 0:
            names[self] = self._get_top_name(self.tops[0], names, autonames)
        elif self not in names:
            autonames[self.type_name] += 1
            names[self] = self.type_name + str(autonames[self.type_name])
        return names[self]

    def _get_top_name(self, top: Top, names: dict, autonames: Counter) -> str:
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = top.fn.type_name + str(autonames[top.fn.type_name])
        return names[top]

    def _update(self, params: dict[str, Any]) -> None:
        self.params.update(params)

    def _to_proto(self, layers: dict, names: dict, autonames: Counter) -> None:
        if self in layers:
            return
        bottom_names = []
        for inp in self.inputs:
            inp._to_proto(layers, names, autonames)
            bottom_names.append(layers[inp.fn].top[inp.n])
        layer = caffe_pb2.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(bottom_names)
        if self.in_place:
            layer.top.extend(layer.bottom)
        else:
            for top in self.tops:
                layer.top.append(self._get_top_name(top, names, autonames))
        layer.name = self._get_name(names, autonames)
        for k, v in self.params.items():
            if k.endswith("param"):
                assign_proto(layer, k, v)
                continue
            stem = _param_names.get(self.type_name)
            sub = getattr(layer, stem + "_param") if stem else None
            if sub is not None and k in sub.DESCRIPTOR.fields_by_name:
                assign_proto(sub, k, v)
            elif k in layer.DESCRIPTOR.fields_by_name:
                assign_proto(layer, k, v)
            else:
                where = f"{stem}_param or " if stem else ""
                raise AttributeError(
                    f"layer {layer.name!r} ({self.type_name}): no field {k!r} in "
                    f"{where}LayerParameter"
                )
        layers[self] = layer


class NoSuchTop(AttributeError, KeyError):
    """A name a NetSpec has no top for. pycaffe's lookup raises a KeyError (for ``n.x`` and
    ``n['x']`` alike); an AttributeError too keeps ``hasattr`` and ``getattr(n, x, None)``
    working."""


class NetSpec:
    """Named tops, in assignment order; ``to_proto()`` gives the NetParameter."""

    def __init__(self) -> None:
        super().__setattr__("tops", OrderedDict())

    def __setattr__(self, name: str, value: Any) -> None:
        self.tops[name] = value

    def __getattr__(self, name: str) -> Any:
        try:
            return self.tops[name]
        except KeyError:
            raise NoSuchTop(name) from None

    def __setitem__(self, key: str, value: Any) -> None:
        self.__setattr__(key, value)

    def __getitem__(self, item: str) -> Any:
        return self.__getattr__(item)

    def __delitem__(self, name: str) -> None:
        del self.tops[name]

    def keys(self) -> list[str]:
        return list(self.tops.keys())

    def vals(self) -> list[Any]:
        return list(self.tops.values())

    def to_proto(self) -> caffe_pb2.NetParameter:
        names = {v: k for k, v in self.tops.items()}
        autonames: Counter = Counter()
        layers: OrderedDict = OrderedDict()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        net = caffe_pb2.NetParameter()
        net.layer.extend(layers.values())
        return net


def to_proto(*tops: Top) -> caffe_pb2.NetParameter:
    """The NetParameter of the layers the given tops depend on, auto-named."""
    layers: OrderedDict = OrderedDict()
    autonames: Counter = Counter()
    for top in tops:
        top.fn._to_proto(layers, {}, autonames)
    net = caffe_pb2.NetParameter()
    net.layer.extend(layers.values())
    return net


class Layers:
    """``L.<Type>(*bottoms, **params)``: a Top, a tuple of Tops (ntop > 1) or the layer
    (ntop = 0)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def layer_fn(*args: Top, **kwargs: Any) -> Any:
            fn = Function(name, args, kwargs)
            if fn.ntop == 0:
                return fn
            if fn.ntop == 1:
                return fn.tops[0]
            return fn.tops

        layer_fn.__name__ = name
        return layer_fn


class Parameters:
    """``P.<Type>.<ENUM>``: enum values of ``caffe_pb2.<Type>Parameter``."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        message = getattr(caffe_pb2, name + "Parameter")

        class Param:
            def __getattr__(self, param_name: str) -> Any:
                return getattr(message, param_name)

        return Param()


layers = Layers()
params = Parameters()
