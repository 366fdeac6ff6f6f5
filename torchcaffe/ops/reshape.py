"""Reshape: replace a range of axes by a new shape (0 copies a dim, -1 infers one)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..registry import register_layer
from .base import CaffeLayer, Shape


@register_layer("Reshape")
class ReshapeLayer(CaffeLayer):
    """Reshaping without copying. Caffe type ``Reshape``, ``reshape_param`` (shape, axis = 0,
    num_axes = -1).

    Bottom axes [axis, axis + num_axes) (num_axes -1: to the end; 0: none, so the new dims
    are inserted) are replaced by ``shape``. A dim of 0 copies the bottom dim at the same
    position (axis + i), one dim of -1 is inferred from the count. axis may be negative: -1
    means after the last axis. No in-place use.
    Differs from torch: 0 copies a dim and the reshaped range is chosen by axis / num_axes.
    """

    param_field = "reshape_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        if list(layer_param.top[:1]) == list(layer_param.bottom[:1]):
            raise self.error(
                "Reshape does not allow in-place computation",
                expected="a top blob other than the bottom",
                got=f"top {layer_param.top[0]!r} == bottom",
            )
        p = self.param
        self.dims = [int(d) for d in p.shape.dim]
        inferred = [i for i, d in enumerate(self.dims) if d == -1]
        if len(inferred) > 1:
            raise self.error(
                "new shape contains multiple -1 dims",
                expected="at most one -1 in shape",
                got=self.dims,
            )
        bad = [d for d in self.dims if d < -1]
        if bad:
            raise self.error(
                "shape dims must be >= 0, or -1 to infer one", expected="dims >= -1", got=self.dims
            )
        if p.num_axes < -1:
            raise self.error(
                "num_axes must be >= 0, or -1 for all", expected=">= -1", got=p.num_axes
            )
        self.inferred_axis = inferred[0] if inferred else -1
        self.axis, self.num_axes = int(p.axis), int(p.num_axes)  # forward never reads the proto
        self.output_shapes(self.bottom_shapes)

    def _range(self, ndim: int) -> tuple[int, int]:
        """[start, end): the bottom axes the new dims replace."""
        start = self.axis if self.axis >= 0 else ndim + self.axis + 1
        return start, ndim if self.num_axes == -1 else start + self.num_axes

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        ndim = len(shape)
        start, end = self._range(ndim)
        if not 0 <= start <= ndim:
            raise self.error(
                f"axis out of range for a {ndim}-D bottom",
                expected=f"{-ndim - 1} <= axis <= {ndim}",
                got=self.axis,
            )
        if end > ndim:
            raise self.error(
                "axis + num_axes is out of range", expected=f"axis + num_axes <= {ndim}", got=end
            )
        top = list(shape[:start]) + list(self.dims) + list(shape[end:])
        for i, d in enumerate(self.dims):
            if d == 0:
                if start + i >= ndim:
                    raise self.error(
                        "shape contains a 0 but there is no bottom axis to copy",
                        expected=f"axis + {i} < {ndim}",
                        got=start + i,
                    )
                top[start + i] = shape[start + i]
        count = math.prod(shape)
        if self.inferred_axis >= 0:
            explicit = math.prod(d for j, d in enumerate(top) if j != start + self.inferred_axis)
            if explicit == 0 or count % explicit:
                raise self.error(
                    f"bottom count ({count}) must be divisible by the product "
                    f"of the specified dimensions",
                    expected=f"a divisor of {count}",
                    got=explicit,
                )
            top[start + self.inferred_axis] = count // explicit
        if math.prod(top) != count:
            raise self.error(
                "output count must match input count",
                expected=f"{count} ({shape})",
                got=f"{math.prod(top)} ({tuple(top)})",
            )
        return [tuple(top)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # checked by output_shapes; here 0 copies a dim and torch infers the -1 (symbolic
        # sizes stay symbolic under torch.compile / torch.export)
        start, end = self._range(x.dim())
        new = [x.shape[start + i] if d == 0 else d for i, d in enumerate(self.dims)]
        # a tuple: a shape of no axes (an empty reshape_param of a one-element bottom, as
        # Caffe allows) is a 0-d top, where torch's reshape(*()) would take no shape at all
        return x.reshape((*x.shape[:start], *new, *x.shape[end:]))
