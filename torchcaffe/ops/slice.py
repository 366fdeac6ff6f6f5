"""Slice: cut one bottom into several tops along one axis."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from .base import AtLeast, CaffeLayer, Exactly, Shape, canonical_axis


@register_layer("Slice")
class SliceLayer(CaffeLayer):
    """Slicing. Caffe type ``Slice``, ``slice_param`` (axis or legacy slice_dim, slice_point).

    With slice_point (one per top boundary, strictly increasing, > 0) top i spans
    [point[i-1], point[i]) of the axis, the last top the rest (possibly empty); without, the
    axis is split into equal parts, one per top. ``slice_dim`` is unsigned and has no negative
    indexing; giving both it and ``axis`` is an error. One top: the top is the bottom.
    Differs from torch: none (torch.split).
    """

    param_field = "slice_param"
    bottoms = Exactly(1)
    tops = AtLeast(1)

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if p.HasField("axis") and p.HasField("slice_dim"):
            raise self.error(
                "either axis or slice_dim should be specified, not both",
                expected="one of axis / slice_dim",
                got=f"axis {p.axis} and slice_dim {p.slice_dim}",
            )
        # read once: forward must not touch the proto (torch.compile cannot trace it)
        self.slice_point = [int(v) for v in p.slice_point]
        self.slice_dim: int | None = p.slice_dim if p.HasField("slice_dim") else None
        self.axis = int(p.axis)
        self.output_shapes(self.bottom_shapes)

    def plan(self, shape: Shape) -> tuple[int, list[int]]:
        """(axis, size of each top along it) for a bottom of this shape, with Caffe's checks."""
        if self.slice_dim is not None:
            if self.slice_dim >= len(shape):
                raise self.error(
                    "slice_dim out of range",
                    expected=f"0 <= slice_dim < {len(shape)}",
                    got=self.slice_dim,
                )
            axis = self.slice_dim
        else:
            axis = canonical_axis(self, self.axis, len(shape))
        size, n = shape[axis], self.num_tops
        if not self.slice_point:
            if size % n:
                raise self.error(
                    f"the number of tops ({n}) should evenly divide the slice axis {axis}",
                    expected=f"a multiple of {n}",
                    got=size,
                )
            return axis, [size // n] * n
        if len(self.slice_point) != n - 1:
            raise self.error(
                "slice_point needs one value per boundary between tops",
                expected=f"{n - 1} slice_point values",
                got=len(self.slice_point),
            )
        if n > size:
            raise self.error(
                f"more tops than entries along the slice axis {axis}",
                expected=f"at most {size} tops",
                got=n,
            )
        sizes, prev = [], 0
        for point in self.slice_point:
            if point <= prev:
                raise self.error(
                    "slice_point values must be strictly increasing and > 0",
                    expected=f"> {prev}",
                    got=point,
                )
            sizes.append(point - prev)
            prev = point
        if prev > size:
            raise self.error(
                f"slice_point beyond the end of the slice axis {axis}",
                expected=f"<= {size}",
                got=prev,
            )
        return axis, sizes + [size - prev]

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        axis, sizes = self.plan(shape)
        return [shape[:axis] + (s,) + shape[axis + 1 :] for s in sizes]

    def forward(self, x: torch.Tensor):
        # the plan was checked by output_shapes (set-up, and Net.infer_shapes per input shape)
        if self.num_tops == 1:
            return x.view_as(x)
        axis = self.axis if self.slice_dim is None else self.slice_dim
        # split by sizes, not tensor_split at indices: torch.onnx's TorchScript exporter writes
        # that as a loop over a sequence whose shapes it loses, and then folds the traced
        # batch into later reshapes (onnxruntime refused such graphs at another batch)
        points = self.slice_point
        if points:
            bounds = [0, *points, x.shape[axis]]
            return torch.split(x, [b - a for a, b in zip(bounds, bounds[1:])], dim=axis)
        # one size per top: an axis of 0 splits into num_tops empty tops, as Caffe's does
        return torch.split(x, [x.shape[axis] // self.num_tops] * self.num_tops, dim=axis)
