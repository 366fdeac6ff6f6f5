"""Caffe's upgrade path for legacy nets and solvers (``src/caffe/util/upgrade_proto.cpp``).

One pure function per Caffe rule, named as Caffe names it (``UpgradeV0Net`` ->
``upgrade_v0_net``): each takes a proto and returns a new one, leaving its input alone.
Where Caffe LOG(FATAL)s, these raise a ``TorchCaffeError``; where Caffe LOG(ERROR)s and carries
on ("is_fully_compatible = false"), they emit an ``UpgradeWarning`` and carry on too.
``upgrade_net_as_needed`` applies the rules in Caffe's order, then one step of our own for
fork dialects (``upgrade_fork_dialects``).
"""

from __future__ import annotations

import difflib
import os
import warnings
from typing import Any, TypeVar, cast

from google.protobuf.message import Message

from ..errors import (
    BlobWiringError,
    LayerParamError,
    PrototxtError,
    SolverError,
    TorchCaffeError,
    UnknownLayerTypeError,
)
from ..proto import caffe_pb2 as pb

PathLike = str | os.PathLike
M = TypeVar("M", bound=Message)

V1Type = pb.V1LayerParameter.LayerType


class UpgradeWarning(UserWarning):
    """Part of a legacy definition that Caffe's upgrade drops while "continuing anyway"."""


class IncompatibleUpgradeWarning(UpgradeWarning):
    """What Caffe's upgrade logs as an error (``is_fully_compatible = false``): its
    upgrade_net_proto_text/binary tools then still write the file but exit with status 1."""


def _warn(
    what: str,
    *,
    path: str | None = None,
    layer: str | None = None,
    layer_type: str | None = None,
    hint: str | None = None,
    category: type[UpgradeWarning] = UpgradeWarning,
) -> None:
    msg = TorchCaffeError(what, path=path, layer=layer, layer_type=layer_type, hint=hint)
    warnings.warn(str(msg), category, stacklevel=3)


def _copy(msg: M) -> M:
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def _fspath(path: PathLike | None) -> str | None:
    return None if path is None else os.fspath(path)


# -- the driver ---------------------------------------------------------------------------


def net_needs_upgrade(net: pb.NetParameter) -> bool:
    """Caffe's NetNeedsUpgrade, plus our fork-dialect step."""
    return (
        net_needs_v0_to_v1_upgrade(net)
        or net_needs_v1_to_v2_upgrade(net)
        or net_needs_data_upgrade(net)
        or net_needs_input_upgrade(net)
        or net_needs_batch_norm_upgrade(net)
        or net_needs_fork_dialect_upgrade(net)
    )


def upgrade_net_as_needed(net: pb.NetParameter, path: PathLike | None = None) -> pb.NetParameter:
    """Caffe's UpgradeNetAsNeeded: V0 -> data transform -> V1 -> input -> BatchNorm, then forks.

    Returns a new V2 ``NetParameter``; ``path`` only names the file in messages.
    """
    path = _fspath(path)
    out = upgrade_v0_net(net, path) if net_needs_v0_to_v1_upgrade(net) else _copy(net)
    if net_needs_data_upgrade(out):
        _transform_params_in_place(out)
    if net_needs_v1_to_v2_upgrade(out):
        out = upgrade_v1_net(out, path)
    if net_needs_input_upgrade(out):
        _net_input_in_place(out, path)
    if net_needs_batch_norm_upgrade(out):
        _batch_norm_in_place(out)
    _fork_dialects_in_place(out, path)
    return out


def _refuse_mixed(net: pb.NetParameter, path: str | None) -> None:
    if len(net.layer) and len(net.layers):
        raise PrototxtError(
            "refusing to upgrade a net that has both 'layer' and 'layers' fields",
            path=path,
            expected="only 'layer { type: \"Convolution\" ... }' (current format)",
            got=f"{len(net.layer)} 'layer' and {len(net.layers)} legacy 'layers'",
            hint="rewrite the legacy 'layers' entries in the 'layer' format",
        )


# -- V0 -> V1 -----------------------------------------------------------------------------


def net_needs_v0_to_v1_upgrade(net: pb.NetParameter) -> bool:
    """True when any legacy ``layers`` entry still wraps a V0 ``layer { ... }`` block."""
    return any(conn.HasField("layer") for conn in net.layers)


_V0_NET_FIELDS_KEPT = {"name", "layers", "input", "input_dim", "force_backward"}


def upgrade_v0_net(net: pb.NetParameter, path: PathLike | None = None) -> pb.NetParameter:
    """Caffe's UpgradeV0Net: fold padding layers, then convert every V0 layer to V1.

    Like Caffe, keeps only name, layers, input, input_dim and force_backward of the net (a
    warning lists anything else dropped). Unlike Caffe, which silently drops V2 ``layer``
    entries here, a net mixing them with V0 layers is refused, as UpgradeV1Net refuses it.
    """
    path = _fspath(path)
    _refuse_mixed(net, path)
    padded = upgrade_v0_padding_layers(net, path)
    out = pb.NetParameter()
    if padded.HasField("name"):
        out.name = padded.name
    for conn in padded.layers:
        _v0_layer_into(conn, out.layers.add(), path)
    out.input.extend(padded.input)
    out.input_dim.extend(padded.input_dim)
    if padded.HasField("force_backward"):
        out.force_backward = padded.force_backward
    dropped = [f.name for f, _ in padded.ListFields() if f.name not in _V0_NET_FIELDS_KEPT]
    if dropped:
        _warn(f"the V0 upgrade drops net field(s) {', '.join(dropped)}", path=path)
    return out


def upgrade_v0_padding_layers(
    net: pb.NetParameter, path: PathLike | None = None
) -> pb.NetParameter:
    """Caffe's UpgradeV0PaddingLayers: a V0 "padding" layer becomes its consumer's ``pad``.

    The consumer must be a single-bottom conv or pool layer and the padding layer must have one
    bottom and one top; the consumer is rewired to the padding layer's bottom.
    """
    path = _fspath(path)
    out = _copy(net)
    out.ClearField("layers")
    last_top: dict[str, int] = {blob: -1 for blob in net.input}
    for i, conn in enumerate(net.layers):
        v0 = conn.layer
        if v0.type != "padding":
            out.layers.add().CopyFrom(conn)
        for j, blob in enumerate(conn.bottom):
            if blob not in last_top:
                raise BlobWiringError(
                    f"unknown bottom blob {blob!r} (bottom {j})",
                    path=path,
                    layer=v0.name,
                    layer_type=v0.type,
                    expected="a net input or a top of an earlier layer",
                    got=blob,
                )
            src_index = last_top[blob]
            if src_index == -1 or net.layers[src_index].layer.type != "padding":
                continue
            _check_padding_fold(conn, net.layers[src_index], path)
            folded = out.layers[-1]
            folded.layer.pad = net.layers[src_index].layer.pad
            folded.bottom[j] = net.layers[src_index].bottom[0]
        for blob in conn.top:
            last_top[blob] = i
    return out


def _check_padding_fold(
    conn: pb.V1LayerParameter, source: pb.V1LayerParameter, path: str | None
) -> None:
    v0, pad = conn.layer, source.layer
    if v0.type not in ("conv", "pool"):
        raise LayerParamError(
            f"takes the output of padding layer '{pad.name}', which Caffe can only fold into "
            "a conv or pool layer",
            path=path,
            layer=v0.name,
            layer_type=v0.type,
            expected="type 'conv' or 'pool'",
            got=repr(v0.type),
        )
    if len(conn.bottom) != 1:
        raise BlobWiringError(
            f"takes the output of padding layer '{pad.name}' among several bottoms",
            path=path,
            layer=v0.name,
            layer_type=v0.type,
            expected="1 bottom",
            got=len(conn.bottom),
        )
    for role, blobs in (("bottom", source.bottom), ("top", source.top)):
        if len(blobs) != 1:
            raise BlobWiringError(
                f"a padding layer must have exactly one {role}",
                path=path,
                layer=pad.name,
                layer_type="padding",
                expected=f"1 {role}",
                got=len(blobs),
            )


_CONV, _IP, _POOL = "convolution_param", "inner_product_param", "pooling_param"
_DATA, _HDF5, _IMAGES, _WINDOW = (
    "data_param",
    "hdf5_data_param",
    "image_data_param",
    "window_data_param",
)
_ANY = "*"  # applies whatever the layer type

# V0 field -> {V0 layer type: (V1 param message, field in it)}, in Caffe's order.
# ``None`` as the field copies the whole message. new_num/new_channels: Caffe ignores them.
V0_FIELD_MAP: tuple[tuple[str, dict[str, tuple[str, str | None]]], ...] = (
    ("num_output", {"conv": (_CONV, "num_output"), "innerproduct": (_IP, "num_output")}),
    ("biasterm", {"conv": (_CONV, "bias_term"), "innerproduct": (_IP, "bias_term")}),
    ("weight_filler", {"conv": (_CONV, "weight_filler"), "innerproduct": (_IP, "weight_filler")}),
    ("bias_filler", {"conv": (_CONV, "bias_filler"), "innerproduct": (_IP, "bias_filler")}),
    ("pad", {"conv": (_CONV, "pad"), "pool": (_POOL, "pad")}),
    ("kernelsize", {"conv": (_CONV, "kernel_size"), "pool": (_POOL, "kernel_size")}),
    ("group", {"conv": (_CONV, "group")}),
    ("stride", {"conv": (_CONV, "stride"), "pool": (_POOL, "stride")}),
    ("pool", {"pool": (_POOL, "pool")}),
    ("dropout_ratio", {"dropout": ("dropout_param", "dropout_ratio")}),
    ("local_size", {"lrn": ("lrn_param", "local_size")}),
    ("alpha", {"lrn": ("lrn_param", "alpha")}),
    ("beta", {"lrn": ("lrn_param", "beta")}),
    ("k", {"lrn": ("lrn_param", "k")}),
    (
        "source",
        {
            "data": (_DATA, "source"),
            "hdf5_data": (_HDF5, "source"),
            "images": (_IMAGES, "source"),
            "window_data": (_WINDOW, "source"),
            "infogain_loss": ("infogain_loss_param", "source"),
        },
    ),
    ("scale", {_ANY: ("transform_param", "scale")}),
    ("meanfile", {_ANY: ("transform_param", "mean_file")}),
    (
        "batchsize",
        {
            "data": (_DATA, "batch_size"),
            "hdf5_data": (_HDF5, "batch_size"),
            "images": (_IMAGES, "batch_size"),
            "window_data": (_WINDOW, "batch_size"),
        },
    ),
    ("cropsize", {_ANY: ("transform_param", "crop_size")}),
    ("mirror", {_ANY: ("transform_param", "mirror")}),
    ("rand_skip", {"data": (_DATA, "rand_skip"), "images": (_IMAGES, "rand_skip")}),
    ("shuffle_images", {"images": (_IMAGES, "shuffle")}),
    ("new_height", {"images": (_IMAGES, "new_height")}),
    ("new_width", {"images": (_IMAGES, "new_width")}),
    ("concat_dim", {"concat": ("concat_param", "concat_dim")}),
    ("det_fg_threshold", {"window_data": (_WINDOW, "fg_threshold")}),
    ("det_bg_threshold", {"window_data": (_WINDOW, "bg_threshold")}),
    ("det_fg_fraction", {"window_data": (_WINDOW, "fg_fraction")}),
    ("det_context_pad", {"window_data": (_WINDOW, "context_pad")}),
    ("det_crop_mode", {"window_data": (_WINDOW, "crop_mode")}),
    ("hdf5_output_param", {"hdf5_output": ("hdf5_output_param", None)}),
)

# V0 type string -> V1 enum name (Caffe's UpgradeV0LayerType).
V0_LAYER_TYPES: dict[str, str] = {
    "accuracy": "ACCURACY",
    "bnll": "BNLL",
    "concat": "CONCAT",
    "conv": "CONVOLUTION",
    "data": "DATA",
    "dropout": "DROPOUT",
    "euclidean_loss": "EUCLIDEAN_LOSS",
    "flatten": "FLATTEN",
    "hdf5_data": "HDF5_DATA",
    "hdf5_output": "HDF5_OUTPUT",
    "im2col": "IM2COL",
    "images": "IMAGE_DATA",
    "infogain_loss": "INFOGAIN_LOSS",
    "innerproduct": "INNER_PRODUCT",
    "lrn": "LRN",
    "multinomial_logistic_loss": "MULTINOMIAL_LOGISTIC_LOSS",
    "pool": "POOLING",
    "relu": "RELU",
    "sigmoid": "SIGMOID",
    "softmax": "SOFTMAX",
    "softmax_loss": "SOFTMAX_LOSS",
    "split": "SPLIT",
    "tanh": "TANH",
    "window_data": "WINDOW_DATA",
}


def upgrade_v0_layer_type(
    type_name: str, *, layer: str | None = None, path: PathLike | None = None
) -> pb.V1LayerParameter.LayerType:
    """Caffe's UpgradeV0LayerType: V0 type string -> V1 ``LayerType`` enum value."""
    if type_name not in V0_LAYER_TYPES:
        close = difflib.get_close_matches(type_name, list(V0_LAYER_TYPES), n=3)
        hint = (
            f"did you mean {', '.join(repr(c) for c in close)}?"
            if close
            else f"V0 layer types are {', '.join(sorted(V0_LAYER_TYPES))}"
        )
        raise UnknownLayerTypeError(type_name, close, path=_fspath(path), layer=layer, hint=hint)
    # EnumTypeWrapper.Value is typed int; the value is one of LayerType's.
    return cast(pb.V1LayerParameter.LayerType, V1Type.Value(V0_LAYER_TYPES[type_name]))


def upgrade_v0_layer_parameter(
    conn: pb.V1LayerParameter, path: PathLike | None = None
) -> pb.V1LayerParameter:
    """Caffe's UpgradeV0LayerParameter: flattened V0 fields -> V1 typed param messages."""
    out = pb.V1LayerParameter()
    _v0_layer_into(conn, out, _fspath(path))
    return out


def _v0_layer_into(conn: pb.V1LayerParameter, dst: pb.V1LayerParameter, path: str | None) -> None:
    dst.bottom.extend(conn.bottom)
    dst.top.extend(conn.top)
    if not conn.HasField("layer"):
        return
    v0 = conn.layer
    if v0.HasField("name"):
        dst.name = v0.name
    type_name = v0.type
    if v0.HasField("type"):
        dst.type = upgrade_v0_layer_type(type_name, layer=v0.name, path=path)
    dst.blobs.extend(v0.blobs)
    dst.blobs_lr.extend(v0.blobs_lr)
    dst.weight_decay.extend(v0.weight_decay)
    for field, targets in V0_FIELD_MAP:
        if not v0.HasField(field):
            continue
        target = targets.get(type_name, targets.get(_ANY))
        if target is None:
            _warn(
                f"V0 parameter '{field}' does not apply to this layer type; dropped, as "
                "Caffe drops it",
                path=path,
                layer=v0.name,
                layer_type=type_name,
                category=IncompatibleUpgradeWarning,
            )
            continue
        param, name = target
        value = getattr(v0, field)
        if field == "pool":
            value = pb.PoolingParameter.PoolMethod.Value(pb.V0LayerParameter.PoolMethod.Name(value))
        _assign(getattr(dst, param), name, value)


def _assign(msg: Message, name: str | None, value: Any) -> None:
    if name is None:
        msg.CopyFrom(value)
        return
    field = msg.DESCRIPTOR.fields_by_name[name]
    if field.is_repeated:
        getattr(msg, name).append(value)
    elif field.message_type is not None:
        getattr(msg, name).CopyFrom(value)
    else:
        setattr(msg, name, value)


# -- V1 data transformation fields ------------------------------------------------------------

_TRANSFORM_OWNERS = (("DATA", _DATA), ("IMAGE_DATA", _IMAGES), ("WINDOW_DATA", _WINDOW))
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


def net_needs_data_upgrade(net: pb.NetParameter) -> bool:
    """True when a V1 data layer keeps scale/mean_file/crop_size/mirror in its own param."""
    for layer in net.layers:
        for enum_name, param in _TRANSFORM_OWNERS:
            if layer.type == V1Type.Value(enum_name) and any(
                getattr(layer, param).HasField(f) for f in _TRANSFORM_FIELDS
            ):
                return True
    return False


def upgrade_net_data_transformation(net: pb.NetParameter) -> pb.NetParameter:
    """Caffe's UpgradeNetDataTransformation: move those fields into ``transform_param``."""
    out = _copy(net)
    _transform_params_in_place(out)
    return out


def _transform_params_in_place(net: pb.NetParameter) -> None:
    """Caffe's macro takes ``mutable_`` handles on every data layer of the three types, so
    each one ends with its param and a ``transform_param`` present, empty if it had nothing
    to move (the upgraded text shows ``transform_param {}`` there, as Caffe's does)."""
    for layer in net.layers:
        for enum_name, param in _TRANSFORM_OWNERS:
            if layer.type != V1Type.Value(enum_name):
                continue
            owner = getattr(layer, param)
            owner.SetInParent()
            layer.transform_param.SetInParent()
            for field in _TRANSFORM_FIELDS:
                if owner.HasField(field):
                    setattr(layer.transform_param, field, getattr(owner, field))
                    owner.ClearField(field)


# -- V1 -> V2 -----------------------------------------------------------------------------


def net_needs_v1_to_v2_upgrade(net: pb.NetParameter) -> bool:
    """True when the net has any legacy ``layers`` entry."""
    return len(net.layers) > 0


# Typed param messages UpgradeV1LayerParameter copies whole, in Caffe's order.
V1_PARAM_FIELDS: tuple[str, ...] = (
    "accuracy_param",
    "argmax_param",
    "concat_param",
    "contrastive_loss_param",
    "convolution_param",
    "data_param",
    "dropout_param",
    "dummy_data_param",
    "eltwise_param",
    "exp_param",
    "hdf5_data_param",
    "hdf5_output_param",
    "hinge_loss_param",
    "image_data_param",
    "infogain_loss_param",
    "inner_product_param",
    "lrn_param",
    "memory_data_param",
    "mvn_param",
    "pooling_param",
    "power_param",
    "relu_param",
    "sigmoid_param",
    "softmax_param",
    "slice_param",
    "tanh_param",
    "threshold_param",
    "window_data_param",
    "transform_param",
    "loss_param",
)
# Fork fields of V1LayerParameter (brocolli's BN in V1 nets): carried over where the V2
# message has the same field, so a fork's V1 net keeps its settings.
V1_FORK_PARAM_FIELDS: tuple[str, ...] = tuple(
    name
    for name in ("bn_param", "batch_norm_param")
    if name in pb.V1LayerParameter.DESCRIPTOR.fields_by_name
    and name in pb.LayerParameter.DESCRIPTOR.fields_by_name
)

# V1 enum name -> V2 type string (Caffe's UpgradeV1LayerType).
V1_LAYER_TYPES: dict[str, str] = {
    "NONE": "",
    "ABSVAL": "AbsVal",
    "ACCURACY": "Accuracy",
    "ARGMAX": "ArgMax",
    "BNLL": "BNLL",
    "CONCAT": "Concat",
    "CONTRASTIVE_LOSS": "ContrastiveLoss",
    "CONVOLUTION": "Convolution",
    "DECONVOLUTION": "Deconvolution",
    "DATA": "Data",
    "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss",
    "ELTWISE": "Eltwise",
    "EXP": "Exp",
    "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data",
    "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss",
    "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss",
    "INNER_PRODUCT": "InnerProduct",
    "LRN": "LRN",
    "MEMORY_DATA": "MemoryData",
    "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN",
    "POOLING": "Pooling",
    "POWER": "Power",
    "RELU": "ReLU",
    "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss",
    "SILENCE": "Silence",
    "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss",
    "SPLIT": "Split",
    "SLICE": "Slice",
    "TANH": "TanH",
    "WINDOW_DATA": "WindowData",
    "THRESHOLD": "Threshold",
}


def upgrade_v1_net(net: pb.NetParameter, path: PathLike | None = None) -> pb.NetParameter:
    """Caffe's UpgradeV1Net: every ``layers`` entry becomes a V2 ``layer``; the rest is kept.

    Raises ``PrototxtError`` for a net that also has ``layer`` entries, as Caffe refuses it.
    """
    path = _fspath(path)
    _refuse_mixed(net, path)
    out = _copy(net)
    out.ClearField("layers")
    for v1 in net.layers:
        _v1_layer_into(v1, out.layer.add(), path)
    return out


def upgrade_v1_layer_type(
    v1_type: int, *, layer: str | None = None, path: PathLike | None = None
) -> str:
    """Caffe's UpgradeV1LayerType: V1 enum value -> V2 type string (NONE -> "")."""
    name = V1Type.Name(v1_type) if v1_type in V1Type.values() else None
    if name not in V1_LAYER_TYPES:
        raise UnknownLayerTypeError(
            f"V1 enum {name or v1_type}",
            path=_fspath(path),
            layer=layer,
            hint=f"V1 layer types are {', '.join(sorted(V1_LAYER_TYPES))}",
        )
    return V1_LAYER_TYPES[name]


def upgrade_v1_layer_parameter(
    v1: pb.V1LayerParameter, path: PathLike | None = None
) -> pb.LayerParameter:
    """Caffe's UpgradeV1LayerParameter: enum type -> string, blobs_lr etc. -> ParamSpec."""
    out = pb.LayerParameter()
    _v1_layer_into(v1, out, _fspath(path))
    return out


def _v1_layer_into(v1: pb.V1LayerParameter, dst: pb.LayerParameter, path: str | None) -> None:
    dst.bottom.extend(v1.bottom)
    dst.top.extend(v1.top)
    if v1.HasField("name"):
        dst.name = v1.name
    dst.include.extend(v1.include)
    dst.exclude.extend(v1.exclude)
    if v1.HasField("type"):
        dst.type = upgrade_v1_layer_type(v1.type, layer=v1.name, path=path)
    dst.blobs.extend(v1.blobs)

    def spec(i: int) -> pb.ParamSpec:
        while len(dst.param) <= i:
            dst.param.add()
        return dst.param[i]

    for i, name in enumerate(v1.param):
        spec(i).name = name
    for i, mode in enumerate(v1.blob_share_mode):
        spec(i).share_mode = pb.ParamSpec.DimCheckMode.Value(
            pb.V1LayerParameter.DimCheckMode.Name(mode)
        )
    for i, lr in enumerate(v1.blobs_lr):
        spec(i).lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        spec(i).decay_mult = decay
    dst.loss_weight.extend(v1.loss_weight)
    for field in V1_PARAM_FIELDS + V1_FORK_PARAM_FIELDS:
        if v1.HasField(field):
            getattr(dst, field).CopyFrom(getattr(v1, field))
    if v1.HasField("layer"):
        _warn(
            "the legacy layer also holds a V0 'layer { ... }' block; ignored, as Caffe ignores it",
            path=path,
            layer=v1.name,
            layer_type=dst.type or None,
            category=IncompatibleUpgradeWarning,
        )


# -- legacy input fields --------------------------------------------------------------------


def net_needs_input_upgrade(net: pb.NetParameter) -> bool:
    """True when the net declares inputs with the legacy ``input`` field."""
    return len(net.input) > 0


def upgrade_net_input(net: pb.NetParameter, path: PathLike | None = None) -> pb.NetParameter:
    """Caffe's UpgradeNetInput: input + input_shape/input_dim -> an Input layer "input" first.

    ``input_dim`` is read in groups of 4 per input; ``input`` without any shape (old
    caffemodels) is just cleared. The legacy fields are always cleared.
    """
    out = _copy(net)
    _net_input_in_place(out, _fspath(path))
    return out


def _net_input_in_place(net: pb.NetParameter, path: str | None) -> None:
    has_shape, has_dim = len(net.input_shape) > 0, len(net.input_dim) > 0
    if has_shape or has_dim:
        n = len(net.input)
        if has_shape and len(net.input_shape) < n:
            raise LayerParamError(
                "each legacy input needs its own input_shape",
                path=path,
                layer="input",
                layer_type="Input",
                expected=f"{n} input_shape (one per input)",
                got=len(net.input_shape),
            )
        if not has_shape and len(net.input_dim) < 4 * n:
            raise LayerParamError(
                "each legacy input needs 4 input_dim values (num, channels, height, width)",
                path=path,
                layer="input",
                layer_type="Input",
                expected=f"{4 * n} input_dim for {n} input(s)",
                got=len(net.input_dim),
            )
        layer = pb.LayerParameter(name="input", type="Input")
        for i, blob in enumerate(net.input):
            layer.top.append(blob)
            shape = layer.input_param.shape.add()
            if has_shape:
                shape.CopyFrom(net.input_shape[i])
            else:
                shape.dim.extend(net.input_dim[4 * i : 4 * i + 4])
        net.layer.insert(0, layer)
    for field in ("input", "input_shape", "input_dim"):
        net.ClearField(field)


# -- BatchNorm with three param specs -------------------------------------------------------


def net_needs_batch_norm_upgrade(net: pb.NetParameter) -> bool:
    """True when a BatchNorm layer declares 3 ParamSpecs (the old way to freeze its stats)."""
    return any(layer.type == "BatchNorm" and len(layer.param) == 3 for layer in net.layer)


def upgrade_net_batch_norm(net: pb.NetParameter) -> pb.NetParameter:
    """Caffe's UpgradeNetBatchNorm: those 3 specs get lr_mult = decay_mult = 0."""
    out = _copy(net)
    _batch_norm_in_place(out)
    return out


def _batch_norm_in_place(net: pb.NetParameter) -> None:
    for layer in net.layer:
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            for spec in layer.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0


# -- fork dialects (ours) -------------------------------------------------------------------


def net_needs_fork_dialect_upgrade(net: pb.NetParameter) -> bool:
    """True when a layer uses a fork field that has a BVLC equivalent (``ceil_mode``)."""
    return any(
        layer.pooling_param.HasField("ceil_mode")
        for layer in net.layer
        if layer.HasField("pooling_param")
    )


def upgrade_fork_dialects(net: pb.NetParameter, path: PathLike | None = None) -> pb.NetParameter:
    """Map fork fields onto their BVLC equivalents: Pooling ``ceil_mode`` -> ``round_mode``.

    ``ceil_mode: true`` is CEIL and ``false`` FLOOR; a layer setting both fields with
    different meanings raises ``LayerParamError``. Runs on V2 ``layer`` entries.
    """
    out = _copy(net)
    _fork_dialects_in_place(out, _fspath(path))
    return out


def _fork_dialects_in_place(net: pb.NetParameter, path: str | None) -> None:
    modes = pb.PoolingParameter.RoundMode
    for layer in net.layer:
        if not layer.HasField("pooling_param"):
            continue
        pool = layer.pooling_param
        if not pool.HasField("ceil_mode"):
            continue
        wanted = pb.PoolingParameter.CEIL if pool.ceil_mode else pb.PoolingParameter.FLOOR
        if pool.HasField("round_mode") and pool.round_mode != wanted:
            raise LayerParamError(
                "pooling_param sets both the fork field ceil_mode and round_mode, and they "
                "disagree",
                path=path,
                layer=layer.name,
                layer_type=layer.type,
                expected=f"round_mode: {modes.Name(wanted)} for ceil_mode: "
                f"{str(pool.ceil_mode).lower()}",
                got=f"round_mode: {modes.Name(pool.round_mode)}",
                hint="keep only one of the two fields",
            )
        pool.round_mode = wanted
        pool.ClearField("ceil_mode")


# -- solver ---------------------------------------------------------------------------------

SOLVER_TYPES: dict[str, str] = {
    "SGD": "SGD",
    "NESTEROV": "Nesterov",
    "ADAGRAD": "AdaGrad",
    "RMSPROP": "RMSProp",
    "ADADELTA": "AdaDelta",
    "ADAM": "Adam",
}


def solver_needs_type_upgrade(solver: pb.SolverParameter) -> bool:
    """True when the solver uses the deprecated ``solver_type`` enum."""
    return solver.HasField("solver_type")


def upgrade_solver_type(
    solver: pb.SolverParameter, path: PathLike | None = None
) -> pb.SolverParameter:
    """Caffe's UpgradeSolverType: ``solver_type: ADAM`` -> ``type: "Adam"``.

    Setting both fields is an error, as in Caffe.
    """
    path = _fspath(path)
    old = pb.SolverParameter.SolverType
    if solver.HasField("solver_type") and solver.HasField("type"):
        raise SolverError(
            "both the deprecated 'solver_type' (enum) and 'type' (string) are set",
            path=path,
            expected="only one of them",
            got=f"solver_type: {old.Name(solver.solver_type)} and type: {solver.type!r}",
            hint="delete the solver_type line",
        )
    out = _copy(solver)
    if not solver.HasField("solver_type"):
        _warn("solver type already up to date; nothing to upgrade", path=path)
        return out
    name = old.Name(solver.solver_type)
    if name not in SOLVER_TYPES:
        raise SolverError(
            "unknown solver_type", path=path, expected=" or ".join(SOLVER_TYPES), got=name
        )
    out.type = SOLVER_TYPES[name]
    out.ClearField("solver_type")
    return out


def upgrade_solver_as_needed(
    solver: pb.SolverParameter, path: PathLike | None = None
) -> pb.SolverParameter:
    """Caffe's UpgradeSolverAsNeeded (today: only the solver_type upgrade)."""
    if solver_needs_type_upgrade(solver):
        return upgrade_solver_type(solver, path)
    return _copy(solver)


def upgrade_snapshot_prefix_property(
    solver: pb.SolverParameter, param_file: PathLike
) -> pb.SolverParameter:
    """Caffe's UpgradeSnapshotPrefixProperty.

    No snapshot_prefix: the solver file's path without its extension. A prefix naming an
    existing directory (relative to the working directory, as in Caffe): that directory plus
    the solver file's stem.
    """
    param_file = os.fspath(param_file)
    out = _copy(solver)
    if not out.HasField("snapshot_prefix"):
        out.snapshot_prefix = os.path.splitext(param_file)[0]
    elif os.path.isdir(out.snapshot_prefix):
        stem = os.path.splitext(os.path.basename(param_file))[0]
        out.snapshot_prefix = os.path.join(out.snapshot_prefix, stem)
    return out
