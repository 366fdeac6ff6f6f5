"""CaffeLayer: the nn.Module every Caffe layer type derives from.

A layer knows only tensors and its own LayerParameter. ``from_param`` is Caffe's
LayerSetUp + Reshape: it validates parameters and arity and creates the param blobs from the
bottom shapes. ``forward`` maps bottom tensors to top tensors; backward comes from autograd
unless a layer's gradient in Caffe differs from the mathematical one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from google.protobuf import text_format
from torch import nn

from .. import limits
from ..errors import BlobWiringError, LayerParamError, TorchCaffeError
from ..formats import user_schema
from ..proto import caffe_pb2
from . import data_watch, hook_watch, mode_watch, opaque_conv
from ._fill_skip import will_be_loaded
from ._zero_blobs import zero_blob
from .data_watch import CaffeParameter
from .fillers import check_filler, fill_

Shape = tuple[int, ...]
_OUR_LAYER_FIELDS = frozenset(caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name)


@dataclass(frozen=True)
class Arity:
    """How many bottoms or tops a layer takes, as Caffe's Exact/Min/MaxNum*Blobs."""

    low: int = 0
    high: int | None = None  # None: unbounded

    def allows(self, n: int) -> bool:
        return n >= self.low and (self.high is None or n <= self.high)

    def describe(self) -> str:
        if self.high == self.low:
            return f"exactly {self.low}"
        if self.high is None:
            return f"at least {self.low}"
        if self.low == 0:
            return f"at most {self.high}"
        return f"{self.low} to {self.high}"


def Exactly(n: int) -> Arity:  # noqa: N802 - reads like Caffe's ExactNumBottomBlobs
    return Arity(n, n)


def AtLeast(n: int) -> Arity:  # noqa: N802
    return Arity(n, None)


def Between(low: int, high: int) -> Arity:  # noqa: N802
    return Arity(low, high)


ANY = Arity(0, None)


class CaffeLayer(nn.Module):
    """Base of every registered layer.

    Subclasses declare ``bottoms`` / ``tops`` arities, ``param_field`` (the LayerParameter
    field holding their ``*_param`` message), and create their param blobs with ``add_blob``
    in Caffe blob order.
    """

    caffe_type: ClassVar[str] = ""
    fork: ClassVar[str | None] = None  # the Caffe fork that defines the type; None: BVLC
    bottoms: ClassVar[Arity] = Exactly(1)
    tops: ClassVar[Arity] = Exactly(1)
    equal_bottom_top: ClassVar[bool] = False  # Caffe's EqualNumBottomTopBlobs
    param_field: ClassVar[str | None] = None
    is_loss: ClassVar[bool] = False  # LossLayer: top 0 weighs 1 unless loss_weight says otherwise
    auto_top_blobs: ClassVar[bool | None] = None  # Caffe's AutoTopBlobs; None: same as is_loss
    has_backward: bool = True  # False: Caffe computes no gradient (a form may set it per instance)
    no_force_backward: ClassVar[frozenset[int]] = frozenset()  # bottoms AllowForceBackward denies
    # bottoms whose diff Caffe's Backward refuses: asked for one (propagate_down, a learnable
    # layer under a loss layer's labels, force_backward), it aborts, e.g. "SoftmaxWithLoss Layer
    # cannot backpropagate to label inputs"; ``backward_aborts``: its Backward is
    # NOT_IMPLEMENTED, so it aborts whenever the net runs it (ArgMax, Threshold)
    refused_bottoms: frozenset[int] = frozenset()  # (a layer may set it per instance)
    backward_aborts: ClassVar[bool] = False
    # bottoms whose diff this layer's Caffe Backward writes whenever it runs, propagate_down
    # or not (see ``always_diffed``)
    always_diffed_bottoms: frozenset[int] = frozenset()
    restrictions: ClassVar[str] = ""  # what Caffe accepts that this layer does not (docs table)
    # a top's shape is known only from the values (``output_shapes`` gives Caffe's first guess)
    shape_depends_on_data: ClassVar[bool] = False
    # why its forward works on host values (numpy, Python loops, a file), which a torch.func
    # transform cannot batch or differentiate; "" where its forward is torch ops alone
    host_forward: ClassVar[str] = ""
    # the forward a layer set on its own instance when built (``NeuronLayer``), which a net
    # tells from one a user puts there later (``hook_watch.replaced_forward``)
    built_forward: Callable[..., Any] | None = None

    layer_param: caffe_pb2.LayerParameter
    name: str
    phase: int
    bottom_shapes: list[Shape]
    num_tops: int
    _blob_names: list[str]
    _user_schema: Any  # a fork's caffe.proto, for its param fields (or None)
    _fork_param: Any

    def __init__(self, layer_param: caffe_pb2.LayerParameter, bottom_shapes: Sequence[Shape]):
        super().__init__()
        self.layer_param = layer_param
        self.name = layer_param.name
        self.phase = layer_param.phase
        self.bottom_shapes = [tuple(int(d) for d in s) for s in bottom_shapes]
        self.num_tops = len(layer_param.top)
        self._blob_names = []
        self._user_schema = user_schema.active()  # a fork's caffe.proto, for its param fields
        self._fork_param = None
        with mode_watch.quiet():  # a layer being built is in no net yet: none to tell
            self.train(self.phase == caffe_pb2.TRAIN)
        # how a compiled graph's opaque op names this layer (``opaque_conv``)
        self.graph_handle = opaque_conv.register(self)

    # Does the prototxt set this layer's own ``phase``? Caffe never changes it then: ``train``
    # and ``eval`` on the net leave such a layer in its phase's mode (the builder sets it).
    own_phase = False

    # Tops the builder appended for Caffe's AutoTopBlobs. Net::Init makes those blobs without
    # listing them in the layer's own LayerParameter, so Net::Save never writes them.
    automatic_tops = 0

    def saved_param(self) -> caffe_pb2.LayerParameter:
        """The LayerParameter Caffe's Layer::ToProto writes into a caffemodel: the layer's
        layer_param_ as LayerSetUp left it (see ``complete_param``), automatic tops left out."""
        lp = caffe_pb2.LayerParameter()
        lp.CopyFrom(self.layer_param)
        if self.automatic_tops:
            del lp.top[len(lp.top) - self.automatic_tops :]
        self.complete_param(lp)
        return lp

    def complete_param(self, lp: caffe_pb2.LayerParameter) -> None:
        """Add what Caffe's LayerSetUp adds to its own layer_param_ (Net::Save writes it);
        most layers add nothing."""

    def train(self, mode: bool = True) -> CaffeLayer:
        if self.own_phase:
            mode = self.phase == caffe_pb2.TRAIN
        switched = mode != self.training
        out = super().train(mode)
        if switched:
            mode_watch.layer_switched()  # the nets' program keys (``TorchNet.layers_off_mode``)
        return out

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        """``.to()`` and kin. A packed weight is dropped first: it holds a weak reference to
        the weight, and torch's ``swap_module_params_on_conversion`` refuses to swap a tensor
        that has one. A param that comes back a plain ``nn.Parameter`` is watched again."""
        cache = getattr(self, "weight_cache", None)
        if cache is not None:
            cache.forget()
        out = super()._apply(fn, recurse)
        data_watch.watch(self)
        return out

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy (``copy.deepcopy``, unpickling) is a layer of its own for compiled graphs."""
        super().__setstate__(state)
        data_watch.watch(self)  # pickled as plain nn.Parameters
        self.graph_handle = opaque_conv.register(self)

    def __setattr__(self, name: str, value: Any) -> None:
        """A plain value (not a tensor or module) under a name that is not a param, buffer or
        submodule is stored as object attributes are: that is all ``nn.Module.__setattr__``
        does with it, after testing it against Parameter and Buffer, whose isinstance hooks
        run in Python (~1 us a call, ~10 calls a layer: ~8% of a ResNet-152 build). An
        instance made without ``__init__`` (dynamo's proxy of a module under inductor's
        ``freezing`` sets its ``__dict__``) has none of the three dicts yet. A ``forward`` set
        on the instance tells the nets to look again (``hook_watch``). A plain ``nn.Parameter``
        becomes a CaffeParameter, in place, so writes through its ``.data`` reach the caches
        (``data_watch``)."""
        d = self.__dict__
        if name == "forward":
            hook_watch.hooks_changed()  # a net runs it, not its passes' steps (hook_watch)
        if (
            not isinstance(value, (torch.Tensor, nn.Module))
            and name not in d.get("_parameters", ())
            and name not in d.get("_buffers", ())
            and name not in d.get("_modules", ())
        ):
            object.__setattr__(self, name, value)
        else:
            if type(value) is nn.Parameter:  # a param put in a blob's place: watched too
                value.__class__ = CaffeParameter
            super().__setattr__(name, value)

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_param(
        cls, layer_param: caffe_pb2.LayerParameter, bottom_shapes: Sequence[Shape]
    ) -> CaffeLayer:
        """Validate arity, then build (Caffe's SetUp); errors carry the layer's name and type."""
        cls.check_arity(layer_param)
        try:
            return cls(layer_param, bottom_shapes)
        except TorchCaffeError as err:
            raise err.located(layer=layer_param.name, layer_type=layer_param.type) from None

    @classmethod
    def check_arity(cls, layer_param: caffe_pb2.LayerParameter) -> None:
        nb, nt = len(layer_param.bottom), len(layer_param.top)
        for what, arity, n in (("bottom", cls.bottoms, nb), ("top", cls.tops, nt)):
            if not arity.allows(n):
                raise BlobWiringError(
                    f"wrong number of {what} blobs",
                    layer=layer_param.name,
                    layer_type=layer_param.type,
                    expected=f"{arity.describe()} {what}(s)",
                    got=n,
                )
        if cls.equal_bottom_top and nb != nt:
            raise BlobWiringError(
                "this layer needs as many tops as bottoms",
                layer=layer_param.name,
                layer_type=layer_param.type,
                expected=f"{nb} top(s)",
                got=nt,
            )

    @property
    def param(self) -> Any:
        """This layer's ``*_param`` message (defaults when absent from the prototxt)."""
        if self.param_field is None:
            raise AttributeError(f"{type(self).__name__} has no param_field")
        if self.param_field in _OUR_LAYER_FIELDS:
            return getattr(self.layer_param, self.param_field)
        return self._param_from_fork()

    def _param_from_fork(self) -> Any:
        """A ``param_field`` only a fork's caffe.proto defines: their message (user_schema)."""
        if self._fork_param is None:
            schema = getattr(self, "_user_schema", None)
            if schema is None:
                raise LayerParamError(
                    f"param_field {self.param_field!r} is not a LayerParameter field of "
                    "torchcaffe's caffe.proto",
                    layer=self.name,
                    layer_type=self.layer_param.type,
                    hint="pass the fork's caffe.proto that defines it (caffe_proto=..., "
                    "--caffe-proto); see docs/forks.md",
                )
            assert self.param_field is not None
            self._fork_param = user_schema.fork_param(schema, self.layer_param, self.param_field)
        return self._fork_param

    def error(
        self,
        what: str,
        *,
        expected: Any = None,
        got: Any = None,
        hint: str | None = None,
        cls: type[TorchCaffeError] = LayerParamError,
    ) -> TorchCaffeError:
        """An error located at this layer, for ``raise self.error(...)``."""
        return cls(
            what, layer=self.name, layer_type=self.caffe_type, expected=expected, got=got, hint=hint
        )

    def add_blob(
        self,
        name: str,
        shape: Sequence[int],
        *,
        filler: Any = None,
        learnable: bool = True,
        value: float | None = None,
    ) -> torch.Tensor:
        """Create the next param blob (Caffe order) as a Parameter, or a buffer if not learnable.

        ``filler`` is a FillerParameter; ``value`` fills a constant instead. Inside
        ``skipping_fillers`` a blob that the weights being loaded hold is left unfilled.
        """
        shape = tuple(int(d) for d in shape)
        problem = limits.shape_problem(shape)
        if problem:  # before any allocation: the shape comes from an untrusted file
            raise self.error(
                f"param blob '{name}' would have shape {limits.shape_text(shape)}: {problem}",
                hint="see docs/limits.md to raise a limit for a net you trust",
            )
        loaded = will_be_loaded(self.name, len(self._blob_names))
        zero = all(shape) and (  # an empty blob goes to fill_, which reports it
            (filler is None and not value)
            or (filler is not None and filler.type == "constant" and filler.value == 0)
        )
        if loaded or zero:  # untouched pages until written, huge ones where large (_zero_blobs)
            tensor = zero_blob(shape)  # loaded: the weights are copied in next
        else:
            tensor = torch.empty(shape, dtype=torch.float32)  # the filler writes every value
        if filler is not None:
            try:
                check_filler(filler)
                if not loaded and not zero:
                    fill_(tensor, filler)
            except TorchCaffeError as err:
                raise err.located(layer=self.name, layer_type=self.caffe_type) from None
        elif loaded:
            pass
        elif value is not None:
            tensor.fill_(value)
        if learnable:
            tensor = CaffeParameter(tensor)  # its ``.data`` writes reach the caches (data_watch)
            self.register_parameter(name, tensor)
        else:
            self.register_buffer(name, tensor)
        self._blob_names.append(name)
        return tensor

    # -- the contract the Net uses --------------------------------------------------------
    @property
    def blob_names(self) -> list[str]:
        """Attribute names of the param blobs, in Caffe blob order."""
        return list(self._blob_names)

    def param_blobs(self) -> list[torch.Tensor]:
        """Param blobs in Caffe order (weights I/O and export use only this).

        Read from the module's own dicts: ``nn.Module.__getattr__`` costs ~1 us a blob, and
        a folded layer checks its sources on every inference call (``FoldedAffine``: 8.3 ->
        4.5 us a call, 53 calls per MobileNetV2 forward)."""
        params, buffers = self._parameters, self._buffers  # values typed Optional; none is
        blobs = [
            params[n] if n in params else buffers[n] if n in buffers else getattr(self, n)
            for n in self._blob_names
        ]  # (in neither dict: a parametrized blob, torch.nn.utils.parametrize's property)
        return cast("list[torch.Tensor]", blobs)

    def set_param_blob(self, index: int, tensor: torch.Tensor) -> None:
        """Replace param blob ``index`` (weight sharing by ParamSpec name)."""
        name = self._blob_names[index]
        if isinstance(tensor, nn.Parameter):
            setattr(self, name, tensor)
        else:
            self.register_buffer(name, tensor)

    def default_loss_weights(self) -> list[float]:
        """Loss weight per top: explicit ``loss_weight`` entries, else Caffe's defaults."""
        weights = list(self.layer_param.loss_weight)
        if weights:
            return weights + [0.0] * (self.num_tops - len(weights))
        if self.is_loss:
            return [1.0] + [0.0] * (self.num_tops - 1)
        return [0.0] * self.num_tops

    def allow_force_backward(self, bottom_index: int) -> bool:
        """Caffe's AllowForceBackward. A layer whose Backward aborts is forced too, as in
        Caffe, so that a backward through it is refused (see ``backward_refusal``)."""
        if bottom_index in self.no_force_backward:
            return False
        return self.has_backward or self.backward_aborts or bottom_index in self.refused_bottoms

    def backward_refusal(
        self, bottom_need_backward: Sequence[bool], bottoms: Sequence[str]
    ) -> str | None:
        """Why Caffe's Backward of this layer aborts with these propagate_down flags, or None."""
        if self.backward_aborts:
            return "the net needs backward through this layer, which has none in Caffe"
        for j, need in enumerate(bottom_need_backward):
            if need and j in self.refused_bottoms:
                return (
                    f"the net needs the diff of bottom {j} ('{bottoms[j]}'), which Caffe's "
                    "Backward of this layer refuses to compute"
                )
        return None

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        """Top shapes for these bottom shapes (Caffe's Reshape), by a forward on meta tensors.

        Layers whose top shape depends on data values override this.
        """
        inputs = tuple(torch.empty(tuple(s), device="meta") for s in bottom_shapes)
        state = {
            k: torch.empty_like(v, device="meta")
            for k, v in itertools.chain(self.named_parameters(), self.named_buffers())
        }
        with torch.no_grad():
            out = torch.func.functional_call(self, state, inputs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [tuple(int(d) for d in t.shape) for t in outs]

    def extra_repr(self) -> str:
        if self.param_field is None or self.param_field not in _OUR_LAYER_FIELDS:
            return ""
        if not self.layer_param.HasField(self.param_field):
            return ""
        return text_format.MessageToString(self.param, as_one_line=True)


# A net runs hooked layers as modules (``hook_watch``): registering a hook tells it to look.
for _register in hook_watch.REGISTER_METHODS:
    setattr(CaffeLayer, _register, hook_watch.noting_changes(getattr(nn.Module, _register)))


def canonical_axis(layer: CaffeLayer, axis: int, num_axes: int, field: str = "axis") -> int:
    """Caffe's CanonicalAxisIndex with a layer-located error."""
    if not -num_axes <= axis < num_axes:
        raise layer.error(
            f"{field} out of range for a {num_axes}-D bottom",
            expected=f"{-num_axes} <= {field} < {num_axes}",
            got=axis,
        )
    return axis + num_axes if axis < 0 else axis


# Where a param blob lives: its layer's parameters dict, buffers dict, its name, the layer.
BlobSlot = tuple[dict[str, Any], dict[str, Any], str, nn.Module]


def blob_slots(layers: Iterable[CaffeLayer]) -> tuple[BlobSlot, ...]:
    """Where each param blob of ``layers`` lives, in Caffe order. ``read_slots`` reads them
    from the layers' dicts on each call, so a blob replaced since (a Parameter moves between
    the two dicts) is seen, for a dict lookup instead of ``__getattr__``'s ~1 us a blob."""
    return tuple(
        (layer._parameters, layer._buffers, name, layer)
        for layer in layers
        for name in layer.blob_names
    )


def module_slots(modules: Iterable[nn.Module]) -> tuple[BlobSlot, ...]:
    """``blob_slots`` of the CaffeLayers among ``modules``; of any other module (one a user
    put in ``net.layers``), the params of it and of its submodules."""
    slots: list[BlobSlot] = []
    for module in modules:
        if isinstance(module, CaffeLayer):
            slots += blob_slots([module])
            continue
        for sub in module.modules():
            slots += [(sub._parameters, sub._buffers, name, sub) for name in sub._parameters]
    return tuple(slots)


def any_requires_grad(slots: Iterable[BlobSlot]) -> bool:
    """Does a blob at ``slots`` (as it is now, as ``read_slots`` reads it) require grad? Stops
    at the first that does."""
    return any(
        (ps[n] if n in ps else bs[n] if n in bs else getattr(layer, n)).requires_grad
        for ps, bs, n, layer in slots
    )


def read_slots(slots: Iterable[BlobSlot]) -> list[torch.Tensor]:
    """The tensors ``blob_slots`` located, as they are now (a parametrized blob, in neither
    dict, as its layer computes it)."""
    return [
        ps[n] if n in ps else bs[n] if n in bs else getattr(layer, n) for ps, bs, n, layer in slots
    ]
