"""Shape rules shared by Bias and Scale: an operand blob applied along bottom[0]'s axes.

The operand (a learned blob or bottom[1]) covers the axes ``axis .. axis + operand.dim()`` of
bottom[0] and is broadcast over the outer and inner axes, as Caffe's outer/dim/inner loops.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import CaffeLayer, Shape, canonical_axis


def learned_shape(
    layer: CaffeLayer, x_shape: Shape, axis: int, num_axes: int, what: str, prefix: str
) -> Shape:
    """Shape of a learned operand blob (Caffe's Bias/Scale LayerSetUp with one bottom)."""
    axis = canonical_axis(layer, axis, len(x_shape), f"{prefix}.axis")
    if num_axes < -1:
        raise layer.error(
            f"{prefix}.num_axes must be non-negative, or -1 to extend to the end of bottom[0]",
            expected="num_axes >= -1",
            got=num_axes,
        )
    if num_axes >= 0 and len(x_shape) < axis + num_axes:
        raise layer.error(
            f"{what} blob's shape extends past bottom[0]'s shape when applied "
            f"starting with bottom[0] axis = {axis}",
            expected=f"axis + num_axes <= {len(x_shape)}",
            got=f"{axis} + {num_axes}",
        )
    end = len(x_shape) if num_axes == -1 else axis + num_axes
    return tuple(x_shape[axis:end])


def operand_axis(
    layer: CaffeLayer,
    x_shape: Sequence[int],
    operand_shape: Sequence[int],
    axis: int,
    what: str,
    prefix: str,
) -> int:
    """The first bottom[0] axis the operand covers, after Caffe's Reshape checks.

    A scalar operand (0 axes) uses axis 0 whatever ``axis`` says, as Caffe does.
    """
    x_shape, operand_shape = tuple(x_shape), tuple(operand_shape)
    if len(operand_shape) == 0:
        return 0
    axis = canonical_axis(layer, axis, len(x_shape), f"{prefix}.axis")
    if len(x_shape) < axis + len(operand_shape):
        raise layer.error(
            f"{what} blob's shape extends past bottom[0]'s shape when applied "
            f"starting with bottom[0] axis = {axis}",
            expected=f"at most {len(x_shape) - axis} {what} axes",
            got=f"{what} shape {list(operand_shape)}",
        )
    covered = x_shape[axis : axis + len(operand_shape)]
    if covered != operand_shape:
        raise layer.error(
            f"dimension mismatch between bottom[0] axes {axis}.."
            f"{axis + len(operand_shape) - 1} and the {what} blob",
            expected=list(covered),
            got=list(operand_shape),
        )
    return axis


def broadcastable(operand: torch.Tensor, axis: int, ndim: int) -> torch.Tensor:
    """The operand viewed with trailing singleton axes, to broadcast against bottom[0]."""
    return operand.reshape(tuple(operand.shape) + (1,) * (ndim - axis - operand.dim()))
