"""ArgMax: indices (and/or values) of the top_k largest entries, per instance or along an axis."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..errors import DataError
from ..registry import register_layer
from ._narrow import is_narrow
from .base import CaffeLayer, Shape, canonical_axis


def _topk_caffe(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest entries along the last dim, in Caffe's order.

    Caffe partially sorts (value, index) pairs with std::greater, so among equal values the
    larger index comes first: a stable descending sort of the reversed row gives that order.
    """
    n = x.shape[-1]
    rev = x.flip(-1)
    if k == 1:
        idx = rev.argmax(-1, keepdim=True)  # first maximum of the reversed row
    else:
        idx = rev.sort(dim=-1, descending=True, stable=True).indices[..., :k]
    return rev.gather(-1, idx), (n - 1) - idx


@register_layer("ArgMax")
class ArgMaxLayer(CaffeLayer):
    """Top-k arg max. Caffe type ``ArgMax``, ``argmax_param`` (out_max_val, top_k = 1, axis).

    Without axis: over the flattened shape[1:] of each item; top shape (N, 1, top_k) or, with
    out_max_val, (N, 2, top_k) holding indices then values (padded with 1s to the bottom's
    axis count when it has more than 3). With axis: shape[axis] becomes top_k, holding the
    indices, or the values when out_max_val. Ties: the larger index first. Indices are float.
    Differs from torch: tie order; forward only (Caffe has no backward).
    """

    param_field = "argmax_param"
    has_backward = False
    backward_aborts = True  # Backward: NOT_IMPLEMENTED

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        self.out_max_val, self.top_k, self.has_axis = p.out_max_val, p.top_k, p.HasField("axis")
        if self.top_k < 1:
            raise self.error("top_k must not be less than 1", expected=">= 1", got=self.top_k)
        self.output_shapes(self.bottom_shapes)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        if self.has_axis:
            axis = canonical_axis(self, self.param.axis, len(shape))
            if self.top_k > shape[axis]:
                raise self.error(
                    f"top_k must be at most the size of axis {axis}",
                    expected=f"<= {shape[axis]}",
                    got=self.top_k,
                )
            return [shape[:axis] + (self.top_k,) + shape[axis + 1 :]]
        if self.top_k > math.prod(shape[1:]):
            raise self.error(
                "top_k must be at most the size of one flattened item",
                expected=f"<= {math.prod(shape[1:])}",
                got=self.top_k,
            )
        top = [1] * max(3, len(shape))
        top[0], top[1], top[2] = shape[0], 2 if self.out_max_val else 1, self.top_k
        return [tuple(top)]

    def _indices(self, idx: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The indices as the top's floats. A 16-bit net's would round an index past 256
        (bfloat16) or 2048 (float16): class 999 of 1000 read 1000, where Caffe's float is
        exact; that is a DataError instead."""
        out = idx.to(dtype)
        if is_narrow(dtype):
            inexact = out.long() != idx
            if bool(inexact.any()):
                raise self.error(
                    f"index {int(idx[inexact][0])} cannot be represented in {dtype}",
                    cls=DataError,
                    hint="run the net in float32 (the top holds indices as floats)",
                )
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach()
        if self.has_axis:
            axis = canonical_axis(self, self.param.axis, x.dim())
            # the last axis by its index: torch.onnx's TorchScript exporter writes movedim's
            # -1 into a Transpose perm as is, which onnxruntime refuses to load
            last = x.dim() - 1
            values, idx = _topk_caffe(x.movedim(axis, last), self.top_k)
            out = values if self.out_max_val else self._indices(idx, x.dtype)
            return out.movedim(last, axis).contiguous()
        values, idx = _topk_caffe(x.reshape(x.shape[0], math.prod(x.shape[1:])), self.top_k)
        parts = [self._indices(idx, x.dtype)] + ([values] if self.out_max_val else [])
        # output_shapes's (N, 1 or 2, top_k, 1, ...), with N as x has it: output_shapes
        # takes int() of each size, which would pin a symbolic batch under torch.export
        ones = (1,) * (max(3, x.dim()) - 3)
        return torch.stack(parts, dim=1).reshape(x.shape[0], len(parts), self.top_k, *ones)
