"""Net::Init as a builder: filtered, split NetParameter -> layer modules + LayerSteps.

Follows Caffe's order exactly: bottoms are looked up among the blobs still available,
in-place tops reuse the bottom's blob, a top produced twice is an error, every layer is set
up from its bottom shapes, then need_backward is pruned from the losses backwards and
force_backward is applied. Shared params (ParamSpec.name) are tied to their owner.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from .. import limits
from ..errors import (
    BlobWiringError,
    LayerParamError,
    TorchCaffeError,
    UnsupportedError,
    UsageError,
)
from ..ops.base import CaffeLayer, Shape
from ..ops.python_layer import from_user_code, note_user_error
from ..proto import caffe_pb2
from ..registry import layer_class
from .feeds import feed_data_layers, feed_hint, partly_fed_hint
from .layer_dict import LayerDict
from .program import LayerStep, ParamInfo
from .splits import insert_splits
from .state import filter_net


@dataclass
class BuiltNet:
    name: str
    modules: dict[str, CaffeLayer] = field(default_factory=dict)
    steps: list[LayerStep] = field(default_factory=list)
    blob_shapes: dict[str, Shape] = field(default_factory=dict)
    blob_order: list[str] = field(default_factory=list)
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    params: list[ParamInfo] = field(default_factory=list)
    force_backward: bool = False


@dataclass
class _LayerRow:
    """One layer while the net is being built; its backward flags change until ``to_step``."""

    index: int
    param: caffe_pb2.LayerParameter  # the builder's copy, automatic tops and phase filled in
    key: str
    module: CaffeLayer
    loss_weights: list[float]
    propagate_down: list[bool]
    need_backward: bool
    bottom_need_backward: list[bool]
    param_need_backward: list[bool]

    def to_step(self) -> LayerStep:
        return LayerStep(
            index=self.index,
            name=self.param.name,
            type=self.param.type,
            key=self.key,
            bottoms=tuple(self.param.bottom),
            tops=tuple(self.param.top),
            loss_weights=tuple(self.loss_weights),
            propagate_down=tuple(self.propagate_down),
            need_backward=self.need_backward,
            bottom_need_backward=tuple(self.bottom_need_backward),
            param_need_backward=tuple(self.param_need_backward),
        )


# What the net's ModuleDict already has (``training``, ``keys``, ``update``, ``_modules``,
# ...): torch's ``add_module`` refuses such a key with a bare KeyError, so a layer of that name
# is renamed.
_MODULE_DICT_NAMES = frozenset(dir(LayerDict()))


def module_key(name: str, taken: set[str]) -> str:
    """A torch-legal, unique submodule key for a Caffe layer name."""
    key = re.sub(r"[^0-9A-Za-z_]", "_", name) or "layer"
    if key[0].isdigit():
        key = "_" + key
    base, n = key, 1
    while key in taken or key in _MODULE_DICT_NAMES:
        n += 1
        key = f"{base}_{n}"
    taken.add(key)
    return key


def build_net(
    net: caffe_pb2.NetParameter,
    state: caffe_pb2.NetState,
    *,
    path: str | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> BuiltNet:
    check_layer_count(net, path)
    input_shapes = _checked_input_shapes(input_shapes, path)
    filtered = filter_net(net, state, path)
    if input_shapes:
        filtered = feed_data_layers(filtered, input_shapes)
    param = insert_splits(filtered, path)
    return _Builder(param, state, path, dict(input_shapes or {})).build()


def _checked_input_shapes(
    input_shapes: Mapping[str, Sequence[int]] | None, path: str | None
) -> dict[str, tuple[int, ...]]:
    """``input_shapes`` as int tuples; a value that is not a sequence of integers (a string
    dim, a float, a bare int) is a UsageError naming the blob, not a ValueError from deep in
    the builder."""
    out: dict[str, tuple[int, ...]] = {}
    for blob, dims in (input_shapes or {}).items():
        try:
            if isinstance(dims, (str, bytes)):
                raise TypeError
            out[blob] = tuple(operator.index(d) for d in dims)
        except TypeError:
            raise UsageError(
                f"input_shapes[{blob!r}] is not a shape",
                path=path,
                expected="a sequence of integer dims, e.g. (1, 3, 224, 224)",
                got=repr(dims),
            ) from None
        if any(not -(2**63) <= d < 2**63 for d in out[blob]):
            raise UsageError(
                f"input_shapes[{blob!r}] has a dim outside int64",
                path=path,
                expected="dims that fit in int64",
                got=repr(dims),
            )
    return out


class _Builder:
    """Net::Init over ``param``, which it owns and completes in place (phase, automatic tops,
    input shapes): build_net hands it the copy insert_splits made."""

    def __init__(
        self,
        param: caffe_pb2.NetParameter,
        state: caffe_pb2.NetState,
        path: str | None,
        input_shapes: dict[str, Sequence[int]],
    ) -> None:
        self.param = param
        self.state = state
        self.path = path
        self.input_shapes = input_shapes
        self.out = BuiltNet(name=param.name, force_backward=param.force_backward)
        self.available: dict[str, None] = {}  # ordered set of blobs no layer consumed yet
        self.blob_need_backward: dict[str, bool] = {}
        self.keys: set[str] = set()
        self.param_owner: dict[str, tuple[int, int]] = {}
        self.learnable: dict[tuple[int, int], int] = {}  # (layer, index) -> index in params
        self.lr_set: list[bool] = []
        self.decay_set: list[bool] = []
        self.modules_by_index: list[CaffeLayer] = []

    def fail(self, err: TorchCaffeError, lp: caffe_pb2.LayerParameter) -> TorchCaffeError:
        return err.located(path=self.path, layer=lp.name, layer_type=lp.type)

    def build(self) -> BuiltNet:
        rows: list[_LayerRow] = []
        # self.param is build_net's own copy (insert_splits made it), so its layers are
        # completed in place: one deep copy of each LayerParameter fewer per build
        for index, lp in enumerate(self.param.layer):
            own_phase = lp.HasField("phase")
            if not own_phase:
                lp.phase = self.state.phase
            automatic = self._add_automatic_tops(lp)
            rows.append(self._add_layer(index, lp))
            rows[-1].module.own_phase = own_phase
            rows[-1].module.automatic_tops = len(automatic)
            for blob in automatic:  # anonymous tops are never net outputs
                del self.available[blob]
        unknown = sorted(set(self.input_shapes) - set(self.out.input_names))
        if unknown:  # a misspelt name would leave the declared shape silently
            raise BlobWiringError(
                f"input_shapes names {unknown}, which are not input blobs of the net",
                path=self.path,
                expected=f"some of {self.out.input_names} (or all of a data layer's tops)",
                got=unknown,
                hint=partly_fed_hint(self.param, unknown),
            )
        self._prune_backward(rows)
        if self.param.force_backward:
            self._force_backward(rows)
        self._always_diffed(rows)
        self.out.steps.extend(row.to_step() for row in rows)
        self.out.output_names = sorted(self.available)  # Caffe iterates a std::set<string>
        return self.out

    # -- one layer ---------------------------------------------------------------------------
    def _add_automatic_tops(self, lp: caffe_pb2.LayerParameter) -> list[str]:
        """Caffe's AutoTopBlobs: a loss layer given no top still gets one (and its loss counts).

        Caffe names every such blob "(automatic)"; a suffix keeps ours unique per layer.
        """
        try:
            cls = layer_class(lp.type)
        except TorchCaffeError:
            return []  # _add_layer reports the unknown type
        auto = cls.is_loss if cls.auto_top_blobs is None else cls.auto_top_blobs
        if not auto or cls.tops.allows(len(lp.top)) or len(lp.top) > cls.tops.low:
            return []
        added: list[str] = []
        while len(lp.top) < cls.tops.low:
            name = "(automatic)"
            if name in self.out.blob_shapes or added:
                name = f"(automatic) {lp.name}/{len(lp.top)}"
            lp.top.append(name)
            added.append(name)
        return added

    def _add_layer(self, index: int, lp: caffe_pb2.LayerParameter) -> _LayerRow:
        """Net::Init's loop body for one layer, step by step."""
        self._check_propagate_down(lp)
        cls = self._resolve_class(lp)
        bottom_shapes, bottom_need_backward, need_backward = self._wire_bottoms(lp)
        self._check_tops(lp)
        module, top_shapes = self._set_up(cls, lp, bottom_shapes)
        key = module_key(lp.name, self.keys)
        self.out.modules[key] = module
        self.modules_by_index.append(module)
        self._register_tops(lp, top_shapes)
        loss_weights = self._loss_weights(module, lp)
        param_need_backward = self._params(index, lp, module)
        need_backward |= any(param_need_backward)
        if need_backward:
            for blob in lp.top:
                self.blob_need_backward[blob] = True
        return _LayerRow(
            index=index,
            param=lp,
            key=key,
            module=module,
            loss_weights=loss_weights,
            propagate_down=[bool(p) for p in lp.propagate_down] or [True] * len(lp.bottom),
            need_backward=need_backward,
            bottom_need_backward=bottom_need_backward,
            param_need_backward=param_need_backward,
        )

    def _check_propagate_down(self, lp: caffe_pb2.LayerParameter) -> None:
        if lp.propagate_down and len(lp.propagate_down) != len(lp.bottom):
            raise self.fail(
                LayerParamError(
                    "propagate_down must be given either 0 times or once per bottom",
                    expected=len(lp.bottom),
                    got=len(lp.propagate_down),
                ),
                lp,
            )

    def _resolve_class(self, lp: caffe_pb2.LayerParameter) -> type[CaffeLayer]:
        try:
            return layer_class(lp.type)
        except TorchCaffeError as err:
            hint = feed_hint(lp)
            if hint:
                err.hint = hint
            raise self.fail(err, lp) from None

    def _wire_bottoms(self, lp: caffe_pb2.LayerParameter) -> tuple[list[Shape], list[bool], bool]:
        """Consume each bottom from the available blobs: its shape and backward flags."""
        need_backward = False
        bottom_shapes: list[Shape] = []
        bottom_need_backward: list[bool] = []
        for j, blob in enumerate(lp.bottom):
            if blob not in self.available:
                if blob in self.out.blob_shapes:
                    what = (
                        f"bottom blob '{blob}' (bottom index {j}) was already consumed "
                        f"by an earlier layer"
                    )
                else:
                    what = f"unknown bottom blob '{blob}' (bottom index {j})"
                raise self.fail(
                    BlobWiringError(
                        what,
                        hint="no earlier layer produces it as a top; check the name and "
                        "the layer order (and include/exclude rules for this phase)",
                    ),
                    lp,
                )
            del self.available[blob]
            bottom_shapes.append(self.out.blob_shapes[blob])
            nb = self.blob_need_backward[blob]
            if lp.propagate_down:
                nb = lp.propagate_down[j]
            bottom_need_backward.append(nb)
            need_backward |= self.blob_need_backward[blob]
        return bottom_shapes, bottom_need_backward, need_backward

    def _check_tops(self, lp: caffe_pb2.LayerParameter) -> None:
        earlier_tops: set[str] = set()  # Caffe's AppendTop sees this layer's earlier tops too
        for j, blob in enumerate(lp.top):
            in_place = j < len(lp.bottom) and lp.bottom[j] == blob
            if not in_place and (blob in self.out.blob_shapes or blob in earlier_tops):
                raise self.fail(
                    BlobWiringError(
                        f"top blob '{blob}' produced by multiple sources",
                        hint="give the top a new name, or make the layer in-place by naming its "
                        "bottom of the same index",
                    ),
                    lp,
                )
            earlier_tops.add(blob)

    def _noted_user_error(self, err: BaseException) -> BaseException:
        """A Python layer's own error, noted with the net's file when it has one (a net
        built from a NetParameter has none: no note saying 'in None')."""
        return note_user_error(err, f"in {self.path}") if self.path else err

    def _set_up(
        self, cls: type[CaffeLayer], lp: caffe_pb2.LayerParameter, bottom_shapes: list[Shape]
    ) -> tuple[CaffeLayer, list[Shape]]:
        """Build the module from its param and bottom shapes (Caffe's SetUp) and its top shapes."""
        if lp.type == "Input":
            self._apply_input_shapes(lp)
        try:
            module = cls.from_param(lp, bottom_shapes)
            top_shapes = module.output_shapes(bottom_shapes)
        except TorchCaffeError as err:
            raise self.fail(err, lp) from None
        except (RuntimeError, ValueError, IndexError, MemoryError) as err:
            if from_user_code(err):  # a Python layer's own error keeps its type (pycaffe)
                raise self._noted_user_error(err) from None
            raise self.fail(
                LayerParamError(
                    f"cannot set up the layer for bottom shapes {bottom_shapes}: {err}"
                ),
                lp,
            ) from err
        except Exception as err:
            if from_user_code(err):
                raise self._noted_user_error(err) from None
            raise
        check_top_shapes(lp, top_shapes, self.fail)
        if len(top_shapes) != len(lp.top):
            raise self.fail(
                BlobWiringError(
                    "layer produced a different number of tops",
                    expected=len(lp.top),
                    got=len(top_shapes),
                ),
                lp,
            )
        return module, top_shapes

    def _register_tops(self, lp: caffe_pb2.LayerParameter, top_shapes: list[Shape]) -> None:
        for blob, shape in zip(lp.top, top_shapes):
            if blob not in self.out.blob_shapes:
                self.out.blob_order.append(blob)
                self.blob_need_backward[blob] = False
            self.out.blob_shapes[blob] = tuple(shape)
            self.available[blob] = None
            if lp.type == "Input":
                self.out.input_names.append(blob)

    def _apply_input_shapes(self, lp: caffe_pb2.LayerParameter) -> None:
        shapes = lp.input_param.shape
        for j, blob in enumerate(lp.top):
            if blob in self.input_shapes:
                dims = [int(d) for d in self.input_shapes[blob]]
                if len(shapes) == 1 and len(lp.top) > 1:  # one shape shared by all tops
                    for _ in range(len(lp.top) - 1):
                        shapes.add().CopyFrom(shapes[0])
                while len(shapes) <= j:
                    shapes.add()
                del shapes[j].dim[:]
                shapes[j].dim.extend(dims)

    def _loss_weights(self, module: CaffeLayer, lp: caffe_pb2.LayerParameter) -> list[float]:
        if lp.loss_weight and len(lp.loss_weight) != len(lp.top):
            raise self.fail(
                LayerParamError(
                    "loss_weight must be unspecified or given once per top blob",
                    expected=len(lp.top),
                    got=len(lp.loss_weight),
                ),
                lp,
            )
        return module.default_loss_weights()

    def _params(self, index: int, lp: caffe_pb2.LayerParameter, module: CaffeLayer) -> list[bool]:
        blobs = module.param_blobs()
        if len(lp.param) > len(blobs):
            raise self.fail(
                LayerParamError(
                    "too many param specs for this layer",
                    expected=f"<= {len(blobs)}",
                    got=len(lp.param),
                ),
                lp,
            )
        pnb = []
        for i in range(len(blobs)):
            spec = lp.param[i] if i < len(lp.param) else caffe_pb2.ParamSpec()
            pnb.append(spec.lr_mult != 0)
            self._append_param(index, lp, module, i, spec)
        return pnb

    def _append_param(
        self,
        index: int,
        lp: caffe_pb2.LayerParameter,
        module: CaffeLayer,
        i: int,
        spec: caffe_pb2.ParamSpec,
    ) -> None:
        name = spec.name
        if not name or name not in self.param_owner:
            if name:
                self.param_owner[name] = (index, i)
            self.learnable[(index, i)] = len(self.out.params)
            self.out.params.append(ParamInfo(lp.name, i, spec.lr_mult, spec.decay_mult, index))
            self.lr_set.append(spec.HasField("lr_mult"))
            self.decay_set.append(spec.HasField("decay_mult"))
            return
        owner_index, owner_i = self.param_owner[name]
        owner_module = self.modules_by_index[owner_index]
        owner_blob = owner_module.param_blobs()[owner_i]
        this_blob = module.param_blobs()[i]
        owner_name = self.param.layer[owner_index].name
        if tuple(owner_blob.shape) != tuple(this_blob.shape):
            if (
                spec.share_mode == caffe_pb2.ParamSpec.PERMISSIVE
                and owner_blob.numel() == this_blob.numel()
            ):
                raise self.fail(
                    UnsupportedError(
                        f"sharing param '{name}' owned by layer '{owner_name}' across different "
                        f"shapes (PERMISSIVE share_mode) is not supported",
                        expected=tuple(owner_blob.shape),
                        got=tuple(this_blob.shape),
                    ),
                    lp,
                )
            raise self.fail(
                LayerParamError(
                    f"cannot share param '{name}' owned by layer '{owner_name}'; shape mismatch",
                    expected=tuple(owner_blob.shape),
                    got=tuple(this_blob.shape),
                ),
                lp,
            )
        module.set_param_blob(i, owner_blob)
        slot = self.learnable[(owner_index, owner_i)]
        self.learnable[(index, i)] = slot
        info = self.out.params[slot]
        if spec.HasField("lr_mult"):
            if self.lr_set[slot] and spec.lr_mult != info.lr_mult:
                raise self.fail(
                    LayerParamError(
                        f"shared param '{name}' has mismatched lr_mult",
                        expected=info.lr_mult,
                        got=spec.lr_mult,
                    ),
                    lp,
                )
            self.lr_set[slot] = True
            info = replace(info, lr_mult=spec.lr_mult)
        if spec.HasField("decay_mult"):
            if self.decay_set[slot] and spec.decay_mult != info.decay_mult:
                raise self.fail(
                    LayerParamError(
                        f"shared param '{name}' has mismatched decay_mult",
                        expected=info.decay_mult,
                        got=spec.decay_mult,
                    ),
                    lp,
                )
            self.decay_set[slot] = True
            info = replace(info, decay_mult=spec.decay_mult)
        self.out.params[slot] = info

    # -- backward flags ----------------------------------------------------------------------
    def _prune_backward(self, rows: list[_LayerRow]) -> None:
        under_loss: set[str] = set()
        skip_backp: set[str] = set()
        for row in reversed(rows):
            lp = row.param
            contributes = False
            skip = True
            for j, blob in enumerate(lp.top):
                if row.loss_weights[j] or blob in under_loss:
                    contributes = True
                if blob not in skip_backp:
                    skip = False
                if contributes and not skip:
                    break
            if row.need_backward and skip:
                row.need_backward = False
                row.bottom_need_backward = [False] * len(lp.bottom)
            if not contributes:
                row.need_backward = False
            for j, blob in enumerate(lp.bottom):
                if contributes:
                    under_loss.add(blob)
                else:
                    row.bottom_need_backward[j] = False
                if not row.bottom_need_backward[j]:
                    skip_backp.add(blob)

    def _force_backward(self, rows: list[_LayerRow]) -> None:
        """Caffe's force_backward: every bottom the layer allows gets a diff, one under
        ``propagate_down: false`` too (so the torch face does not stop the gradient there)."""
        for row in rows:
            row.need_backward = True
            flags = row.bottom_need_backward
            for j, blob in enumerate(row.param.bottom):
                forced = row.module.allow_force_backward(j)
                flags[j] = flags[j] or forced
                row.propagate_down[j] = row.propagate_down[j] or forced
                self.blob_need_backward[blob] = self.blob_need_backward[blob] or flags[j]
            row.param_need_backward = [True] * len(row.param_need_backward)

    @staticmethod
    def _always_diffed(rows: list[_LayerRow]) -> None:
        """A layer whose Caffe Backward writes some bottom diffs unconditionally (an RNN's or
        LSTM's x) writes them whenever it runs backward, even where the net needs none."""
        for row in rows:
            if row.need_backward:
                for j in row.module.always_diffed_bottoms:
                    row.bottom_need_backward[j] = True


def check_layer_count(net: caffe_pb2.NetParameter, path: str | None) -> None:
    """The max_layers limit, before any layer is built."""
    count, cap = len(net.layer) + len(net.layers), limits.get().max_layers
    if count > cap:
        raise LayerParamError(
            f"the net has {count} layers, more than the limit of {cap} (max_layers)",
            path=path,
            hint="see docs/limits.md to raise it for a net you trust",
        )


def check_top_shapes(lp: caffe_pb2.LayerParameter, shapes: Sequence[Shape], fail) -> None:
    """Every top a layer would produce fits the blob limits (Caffe's Blob::Reshape checks)."""
    for blob, shape in zip(lp.top, shapes):
        problem = limits.shape_problem(tuple(int(d) for d in shape))
        if problem:
            raise fail(
                LayerParamError(
                    f"top '{blob}' would have shape {limits.shape_text(shape)}: {problem}",
                    hint="see docs/limits.md to raise a limit for a net you trust",
                ),
                lp,
            )


def set_requires_grad(modules: Mapping[str, CaffeLayer], steps: Sequence[LayerStep]) -> None:
    """Params require grad exactly where Caffe computes their diff (param_propagate_down)."""
    flags: dict[int, bool] = {}
    for step in steps:
        module = modules[step.key]
        for blob, need in zip(module.param_blobs(), step.param_need_backward):
            if isinstance(blob, torch.nn.Parameter):
                flags[id(blob)] = flags.get(id(blob), False) or need
    for step in steps:
        for blob in modules[step.key].param_blobs():
            if isinstance(blob, torch.nn.Parameter):
                blob.requires_grad_(flags[id(blob)])
