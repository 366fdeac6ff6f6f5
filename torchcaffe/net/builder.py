"""Net::Init as a builder: filtered, split NetParameter -> layer modules + LayerSteps.

Follows Caffe's order exactly: bottoms are looked up among the blobs still available,
in-place tops reuse the bottom's blob, a top produced twice is an error, every layer is set
up from its bottom shapes, then need_backward is pruned from the losses backwards and
force_backward is applied. Shared params (ParamSpec.name) are tied to their owner.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ..errors import BlobWiringError, LayerParamError, TorchCaffeError, UnsupportedError
from ..ops.base import CaffeLayer, Shape
from ..ops.python_layer import from_user_code, note_user_error
from ..proto import caffe_pb2
from ..registry import layer_class
from .feeds import feed_data_layers, feed_hint
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


def module_key(name: str, taken: set[str]) -> str:
    """A torch-legal, unique submodule key for a Caffe layer name."""
    key = re.sub(r"[^0-9A-Za-z_]", "_", name) or "layer"
    if key[0].isdigit():
        key = "_" + key
    base, n = key, 1
    while key in taken:
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
    filtered = filter_net(net, state, path)
    if input_shapes:
        filtered = feed_data_layers(filtered, input_shapes)
    param = insert_splits(filtered, path)
    return _Builder(param, state, path, dict(input_shapes or {})).build()


class _Builder:
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
        self.available: list[str] = []  # insertion-ordered set of blobs no layer consumed yet
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
        rows = []
        for index, lp_in in enumerate(self.param.layer):
            lp = caffe_pb2.LayerParameter()
            lp.CopyFrom(lp_in)
            if not lp.HasField("phase"):
                lp.phase = self.state.phase
            automatic = self._add_automatic_tops(lp)
            rows.append(self._add_layer(index, lp))
            for blob in automatic:  # anonymous tops are never net outputs
                self.available.remove(blob)
        self._prune_backward(rows)
        if self.param.force_backward:
            self._force_backward(rows)
        out = self.out
        for row in rows:
            out.steps.append(
                LayerStep(
                    index=row["index"],
                    name=row["lp"].name,
                    type=row["lp"].type,
                    key=row["key"],
                    bottoms=tuple(row["lp"].bottom),
                    tops=tuple(row["lp"].top),
                    loss_weights=tuple(row["loss"]),
                    propagate_down=tuple(row["pd"]),
                    need_backward=row["need"],
                    bottom_need_backward=tuple(row["bnb"]),
                    param_need_backward=tuple(row["pnb"]),
                )
            )
        out.output_names = sorted(self.available)  # Caffe iterates a std::set<string>
        return out

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
        added = []
        while len(lp.top) < cls.tops.low:
            name = "(automatic)"
            if name in self.out.blob_shapes or added:
                name = f"(automatic) {lp.name}/{len(lp.top)}"
            lp.top.append(name)
            added.append(name)
        return added

    def _add_layer(self, index: int, lp: caffe_pb2.LayerParameter) -> dict:
        if lp.propagate_down and len(lp.propagate_down) != len(lp.bottom):
            raise self.fail(
                LayerParamError(
                    "propagate_down must be given either 0 times or once per bottom",
                    expected=len(lp.bottom),
                    got=len(lp.propagate_down),
                ),
                lp,
            )
        try:
            cls = layer_class(lp.type)
        except TorchCaffeError as err:
            hint = feed_hint(lp)
            if hint:
                err.hint = hint
            raise self.fail(err, lp) from None
        need_backward = False
        bottom_shapes, bnb = [], []
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
            self.available.remove(blob)
            bottom_shapes.append(self.out.blob_shapes[blob])
            nb = self.blob_need_backward[blob]
            if lp.propagate_down:
                nb = lp.propagate_down[j]
            bnb.append(nb)
            need_backward |= self.blob_need_backward[blob]
        for j, blob in enumerate(lp.top):
            in_place = j < len(lp.bottom) and lp.bottom[j] == blob
            if not in_place and blob in self.out.blob_shapes:
                raise self.fail(
                    BlobWiringError(
                        f"top blob '{blob}' produced by multiple sources",
                        hint="give the top a new name, or make the layer in-place by naming its "
                        "bottom of the same index",
                    ),
                    lp,
                )
        if lp.type == "Input":
            self._apply_input_shapes(lp)
        try:
            module = cls.from_param(lp, bottom_shapes)
            top_shapes = module.output_shapes(bottom_shapes)
        except TorchCaffeError as err:
            raise self.fail(err, lp) from None
        except (RuntimeError, ValueError, IndexError) as err:
            if from_user_code(err):  # a Python layer's own error keeps its type (pycaffe)
                raise note_user_error(err, f"in {self.path}") from None
            raise self.fail(
                LayerParamError(
                    f"cannot set up the layer for bottom shapes {bottom_shapes}: {err}"
                ),
                lp,
            ) from err
        except Exception as err:
            if from_user_code(err):
                raise note_user_error(err, f"in {self.path}") from None
            raise
        if len(top_shapes) != len(lp.top):
            raise self.fail(
                BlobWiringError(
                    "layer produced a different number of tops",
                    expected=len(lp.top),
                    got=len(top_shapes),
                ),
                lp,
            )
        key = module_key(lp.name, self.keys)
        self.out.modules[key] = module
        self.modules_by_index.append(module)
        for blob, shape in zip(lp.top, top_shapes):
            if blob not in self.out.blob_shapes:
                self.out.blob_order.append(blob)
                self.blob_need_backward[blob] = False
            self.out.blob_shapes[blob] = tuple(shape)
            if blob not in self.available:
                self.available.append(blob)
            if lp.type == "Input":
                self.out.input_names.append(blob)
        loss = self._loss_weights(module, lp)
        pnb = self._params(index, lp, module)
        need_backward |= any(pnb)
        if need_backward:
            for blob in lp.top:
                self.blob_need_backward[blob] = True
        return {
            "index": index,
            "lp": lp,
            "key": key,
            "module": module,
            "loss": loss,
            "pd": [bool(p) for p in lp.propagate_down] or [True] * len(lp.bottom),
            "need": need_backward,
            "bnb": bnb,
            "pnb": pnb,
        }

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
        display = name or str(i)
        if not name or name not in self.param_owner:
            if name:
                self.param_owner[name] = (index, i)
            self.learnable[(index, i)] = len(self.out.params)
            self.out.params.append(ParamInfo(lp.name, i, display, spec.lr_mult, spec.decay_mult))
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
            info = _replace(info, lr_mult=spec.lr_mult)
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
            info = _replace(info, decay_mult=spec.decay_mult)
        self.out.params[slot] = info

    # -- backward flags ----------------------------------------------------------------------
    def _prune_backward(self, rows: list[dict]) -> None:
        under_loss: set[str] = set()
        skip_backp: set[str] = set()
        for row in reversed(rows):
            lp = row["lp"]
            contributes = False
            skip = True
            for j, blob in enumerate(lp.top):
                if row["loss"][j] or blob in under_loss:
                    contributes = True
                if blob not in skip_backp:
                    skip = False
                if contributes and not skip:
                    break
            if row["need"] and skip:
                row["need"] = False
                row["bnb"] = [False] * len(lp.bottom)
            if not contributes:
                row["need"] = False
            for j, blob in enumerate(lp.bottom):
                if contributes:
                    under_loss.add(blob)
                else:
                    row["bnb"][j] = False
                if not row["bnb"][j]:
                    skip_backp.add(blob)

    def _force_backward(self, rows: list[dict]) -> None:
        for row in rows:
            module = row["module"]
            row["need"] = True
            for j, blob in enumerate(row["lp"].bottom):
                row["bnb"][j] = row["bnb"][j] or module.allow_force_backward(j)
                self.blob_need_backward[blob] = self.blob_need_backward[blob] or row["bnb"][j]
            row["pnb"] = [True] * len(row["pnb"])


def _replace(info: ParamInfo, **kw) -> ParamInfo:
    from dataclasses import replace

    return replace(info, **kw)


def set_requires_grad(modules: Mapping[str, torch.nn.Module], steps: Sequence[LayerStep]) -> None:
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
