"""Shared pieces of Caffe's loss layers: the LossLayer contract and the loss normalizer.

Caffe's LossLayer takes two bottoms with equal first dimensions, gives a scalar top of loss
weight 1 by default, and never backpropagates to bottom 1 (the labels). SoftmaxWithLoss,
SigmoidCrossEntropyLoss and InfogainLoss divide their summed loss by a normalizer chosen by
``loss_param.normalization`` and clamped to at least 1 (``get_normalizer``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from google.protobuf import text_format

from .. import runtime
from ..errors import DataError, LayerParamError
from ..proto import caffe_pb2
from ._narrow import is_narrow
from ._transforms import under_func_transform
from .base import CaffeLayer, Exactly, Shape

Norm = caffe_pb2.LossParameter

FLT_MIN = float(np.finfo(np.float32).tiny)  # SoftmaxWithLoss clamps probabilities here
# kLOG_THRESHOLD in loss_layer.hpp is a float constant, so it is float32's 1e-20 in both Dtypes.
LOG_THRESHOLD = float(np.float32(1e-20))


def legacy_dim(shape: Shape, index: int) -> int:
    """Blob::LegacyShape: num/channels/height/width, 1 past the blob's last axis."""
    return int(shape[index]) if index < len(shape) else 1


class LossLayer(CaffeLayer):
    """Caffe's LossLayer: bottoms (prediction, label), one scalar top, no backprop to labels."""

    bottoms = Exactly(2)
    tops = Exactly(1)
    is_loss = True
    no_force_backward = frozenset({1})

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self._check_first_dims(self.bottom_shapes)

    def _check_first_dims(self, shapes: Sequence[Shape]) -> None:
        s0, s1 = shapes[0], shapes[1]
        if not s0 or not s1 or s0[0] != s1[0]:
            raise self.error(
                "the data and label should have the same first dimension",
                expected=f"label shape starting with {tuple(s0[:1])}",
                got=tuple(s1),
            )

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        """LossLayer::Reshape checks its bottoms at every new shape: here the first dims, then
        the forward's own checks on meta tensors, so a mismatch is a located error before any
        layer runs (not one from inside this layer's forward, or a bare torch error)."""
        self._check_first_dims(bottom_shapes)
        super().output_shapes(bottom_shapes)
        return [()] + [tuple(int(d) for d in bottom_shapes[0])] * (self.num_tops - 1)

    def complete_param(self, lp: caffe_pb2.LayerParameter) -> None:
        """LossLayer::LayerSetUp: no loss_weight means a weight of 1 on the loss top."""
        if not lp.loss_weight:
            lp.loss_weight.append(1.0)


def check_label_count(
    layer: CaffeLayer, shape: Sequence[int], label_shape: Sequence[int], axis: int
) -> None:
    """One label per prediction: label count == count of ``shape`` without ``axis``."""
    want = math.prod(shape[:axis]) * math.prod(shape[axis + 1 :])
    if math.prod(label_shape) != want:
        raise layer.error(
            "number of labels must match number of predictions",
            expected=f"{want} labels (the count of {tuple(shape)} without axis "
            f"{axis}), integers in [0, {shape[axis]})",
            got=f"label shape {tuple(label_shape)}",
        )


def normalization_mode(layer: CaffeLayer, default: int | None = None) -> int:
    """The NormalizationMode a layer uses, resolving the legacy ``normalize`` bool.

    SoftmaxWithLoss: ``normalization`` when set, else normalize true -> VALID, false ->
    BATCH_SIZE, else the field default (VALID). SigmoidCrossEntropyLoss passes
    ``default=BATCH_SIZE``: its unset default differs from the proto's.
    """
    p = layer.layer_param.loss_param
    if p.HasField("normalization"):
        return p.normalization
    if p.HasField("normalize"):
        return Norm.VALID if p.normalize else Norm.BATCH_SIZE
    return p.normalization if default is None else default


def summed(loss: torch.Tensor) -> torch.Tensor:
    """The sum of a loss layer's per-element losses, in float32 for a 16-bit float net: a
    float16 sum past 65504 is inf, where Caffe's float one is finite (``like`` of
    ``normalizer`` then carries float32; the layer rounds its loss back once)."""
    if is_narrow(loss.dtype):
        return loss.sum(dtype=torch.float32)
    return loss.sum()


def normalizer(
    mode: int, outer: int, inner: int, valid: torch.Tensor | None, like: torch.Tensor
) -> torch.Tensor | float:
    """Caffe's get_normalizer, at least 1. ``valid``: mask of counted labels (None: all);
    the count takes ``like``'s dtype (give the summed loss: float32 for a 16-bit net)."""
    if mode == Norm.FULL:
        return _at_least_one(outer * inner)
    if mode == Norm.VALID:
        if valid is None:
            return _at_least_one(outer * inner)
        return valid.sum().to(like.dtype).clamp(min=1.0)
    if mode == Norm.BATCH_SIZE:
        return _at_least_one(outer)
    if mode == Norm.NONE:
        return 1.0
    raise LayerParamError(
        "unknown loss normalization mode", expected="FULL, VALID, BATCH_SIZE or NONE", got=mode
    )


def _at_least_one(count: int | torch.SymInt) -> float:
    """max(1, count) as a float; a symbolic count (a dynamic batch under torch.export, or
    one jit's tracer follows) stays symbolic, where float() would fix it at the traced size."""
    if isinstance(count, torch.SymInt):
        return torch.sym_float(torch.sym_max(1, count))  # type: ignore[return-value]
    if torch.jit.is_tracing():
        # the tracer follows a size through arithmetic on it, not through max() or float():
        # the TorchScript ONNX export divided by the traced batch at every batch (without
        # max(1, ...), a traced graph run on an empty batch divides by 0)
        return count
    return float(max(1, count))


def ignore_label(param) -> int | None:
    """``ignore_label`` of a LossParameter/AccuracyParameter when set, else None."""
    return param.ignore_label if param.HasField("ignore_label") else None


def index_checks_wanted(index: torch.Tensor) -> bool:
    """Whether to range-check an index tensor: on the CPU (no sync, one compare), and on a
    device only when label-range checks are on (reading the result syncs with it). Never
    in a trace (torch.compile, torch.export, jit): reading the result there is a graph
    break, or a data-dependent guard that fails the export; nor under a torch.func
    transform, which branches on no value. torch's own gather and scatter kernels still
    refuse an index out of range."""
    if (
        index.is_meta
        or torch.compiler.is_compiling()
        or torch.jit.is_tracing()
        or under_func_transform()
    ):
        return False
    return index.is_cpu or runtime.label_range_checks()


def check_labels(
    layer: CaffeLayer, labels: torch.Tensor, valid: torch.Tensor | None, num_labels: int
) -> None:
    """Raise DataError for a counted label outside [0, num_labels), or NaN (Caffe only
    DCHECKs; torch's indexing would raise its own bare error, or read garbage).

    Where ``index_checks_wanted``: always on the CPU (a compare, no sync); on a device only
    with ``torchcaffe.runtime.set_label_range_checks`` (the check syncs with it).
    """
    if not index_checks_wanted(labels):
        return
    bad = ~(labels >= 0) | (labels >= num_labels)  # NaN is neither
    if valid is not None:
        bad = bad & valid
    if bool(bad.any()):
        first = float(labels[bad].reshape(-1)[0])
        raise layer.error(
            "label value out of range",
            cls=DataError,
            expected=f"integers in [0, {num_labels})",
            got=int(first) if first.is_integer() else first,
        )


def params_repr(layer: CaffeLayer, *fields: str) -> str:
    """extra_repr for a layer reading several ``*_param`` messages: the ones that are set."""
    lp = layer.layer_param
    return " ".join(
        f"{f} {{ {text_format.MessageToString(getattr(lp, f), as_one_line=True)} }}"
        for f in fields
        if lp.HasField(f)
    )
