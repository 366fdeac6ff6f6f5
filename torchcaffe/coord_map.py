"""pycaffe's ``caffe.coord_map``: how output coordinates map to input coordinates in a NetSpec.

A map is ``(axis, a, b)``: ``x_in = a * x_out + b`` on spatial axes from ``axis`` on. Each
spatial layer has one (Convolution/Pooling/Im2col shrink by the stride and shift by the pad,
Deconvolution the reverse, Crop shifts by its offset, element-wise layers pass through);
``coord_map_from_to`` composes them along the graph between two tops and ``crop`` makes the
Crop layer that aligns one top to another (as FCN's surgery does).

The exceptions keep pycaffe's names (``UndefinedMapException``, ``AxisMismatchException``)
and are importable from here as in pycaffe.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import AxisMismatchException, CoordMapError, UndefinedMapException
from .net_spec import Function, Top
from .net_spec import layers as L

PASS_THROUGH_LAYERS = [
    "AbsVal",
    "BatchNorm",
    "Bias",
    "BNLL",
    "Dropout",
    "Eltwise",
    "ELU",
    "Log",
    "LRN",
    "Exp",
    "MVN",
    "Power",
    "ReLU",
    "PReLU",
    "Scale",
    "Sigmoid",
    "Split",
    "TanH",
    "Threshold",
    "Concat",  # not in pycaffe's list; identity along the channel axis (U-Nets crop through it)
]

CoordMap = tuple[Any, Any, Any]


def conv_params(fn: Function) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """axis, stride, effective (dilated) kernel size and pad of a Convolution-like layer."""
    params = fn.params.get("convolution_param", fn.params)
    axis = params.get("axis", 1)
    ks = np.array(params["kernel_size"], ndmin=1)
    dilation = np.array(params.get("dilation", 1), ndmin=1)
    legacy = {"pad_h", "pad_w", "kernel_h", "kernel_w", "stride_h", "stride_w"}
    if legacy & (set(params) | set(fn.params)):  # pycaffe checks the layer's own keywords
        raise AssertionError("cropping does not support legacy _h/_w params")
    return (
        axis,
        np.array(params.get("stride", 1), ndmin=1),
        (ks - 1) * dilation + 1,
        np.array(params.get("pad", 0), ndmin=1),
    )


def crop_params(fn: Function) -> tuple[int, np.ndarray]:
    """axis and offset of a Crop layer."""
    params = fn.params.get("crop_param", fn.params)
    return params.get("axis", 2), np.array(params.get("offset", 0), ndmin=1)


def coord_map(fn: Function) -> CoordMap:
    """The layer's own map from its top's coordinates to its bottom's."""
    if fn.type_name in ("Convolution", "Pooling", "Im2col"):
        axis, stride, ks, pad = conv_params(fn)
        return axis, 1 / stride, (pad - (ks - 1) / 2) / stride
    if fn.type_name == "Deconvolution":
        axis, stride, ks, pad = conv_params(fn)
        return axis, stride, (ks - 1) / 2 - pad
    if fn.type_name == "Concat":
        params = fn.params.get("concat_param", fn.params)
        axis = params.get("axis", params.get("concat_dim", 1))
        if axis not in (0, 1):  # along a spatial axis the coordinates shift per bottom
            raise UndefinedMapException(f"a Concat along axis {axis} has no coordinate map")
    if fn.type_name in PASS_THROUGH_LAYERS:
        return None, 1, 0  # identity on any axis
    if fn.type_name == "Crop":
        axis, offset = crop_params(fn)
        return axis - 1, 1, -offset  # -1: the last non-coordinate axis
    raise UndefinedMapException(f"layer type {fn.type_name} has no coordinate map")


def compose(base_map: CoordMap, next_map: CoordMap) -> CoordMap:
    """``base_map`` after ``next_map``."""
    ax1, a1, b1 = base_map
    ax2, a2, b2 = next_map
    if ax1 is None:
        ax = ax2
    elif ax2 is None or ax1 == ax2:
        ax = ax1
    else:
        raise AxisMismatchException(
            "the maps start at different axes", expected=f"axis {ax1}", got=f"axis {ax2}"
        )
    return ax, a1 * a2, a1 * b2 + b1


def inverse(coord_map: CoordMap) -> CoordMap:
    """The map the other way round."""
    ax, a, b = coord_map
    return ax, 1 / a, -b / a


def _bottoms(top: Top) -> tuple:
    bottoms = top.fn.inputs
    return bottoms[:1] if top.fn.type_name == "Crop" else bottoms  # Crop's 2nd is a reference


def coord_map_from_to(top_from: Top, top_to: Top) -> CoordMap:
    """The map from ``top_from``'s coordinates to ``top_to``'s, through a common ancestor.

    Raises RuntimeError when no chain of spatial layers connects them.
    """
    from_maps: dict[Top, CoordMap] = {top_from: (None, 1, 0)}
    frontier = {top_from}
    while frontier:
        top = frontier.pop()
        try:
            for bottom in _bottoms(top):
                from_maps[bottom] = compose(from_maps[top], coord_map(top.fn))
                frontier.add(bottom)
        except UndefinedMapException:
            pass
    to_maps: dict[Top, CoordMap] = {top_to: (None, 1, 0)}
    frontier = {top_to}
    while frontier:
        top = frontier.pop()
        if top in from_maps:
            return compose(to_maps[top], inverse(from_maps[top]))
        try:
            for bottom in _bottoms(top):
                to_maps[bottom] = compose(to_maps[top], coord_map(top.fn))
                frontier.add(bottom)
        except UndefinedMapException:
            continue
    raise CoordMapError(
        "cannot compute a map between the tops: no chain of spatial layers connects them"
    )


def crop(top_from: Top, top_to: Top) -> Top:
    """A Crop layer that crops ``top_from`` to line up with ``top_to``."""
    ax, a, b = coord_map_from_to(top_from, top_to)
    if not np.all(a == 1):
        raise AssertionError(f"scale mismatch on crop (a = {a})")
    if not np.all(b <= 0):
        raise AssertionError(f"cannot crop negative offset (b = {b})")
    if not np.all(np.round(b) == b):
        raise AssertionError(f"cannot crop noninteger offset (b = {b})")
    offset = [int(v) for v in np.atleast_1d(-np.round(b).astype(int))]
    return L.Crop(top_from, top_to, crop_param=dict(axis=ax + 1, offset=offset))
