"""Upsample: brocolli's nearest-neighbour form (1 bottom) or SegNet's unpooling form (2)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from google.protobuf import text_format

from ..registry import register_layer
from ._functional.unpool import check_mask_range, segnet_unpool
from .base import Between, CaffeLayer, Shape

_SEGNET_FIELDS = ("scale_h", "scale_w", "pad_out_h", "pad_out_w", "upsample_h", "upsample_w")


@register_layer("Upsample", fork="brocolli, SegNet")
class UpsampleLayer(CaffeLayer):
    """Upsampling. Caffe type ``Upsample``, ``upsample_param``; two forks share the name:

    * one bottom (brocolli-caffe): nearest neighbour, ``top[..., h, w] = x[..., h // scale,
      w // scale]`` on the last two axes (``dims_num: 4``) or the last one (``dims_num: 3``);
      scale defaults to 1. No backward (the fork's Backward_cpu is empty).
    * two bottoms (SegNet): values and the mask top of a MAX Pooling layer; output
      (N, C, upsample_h, upsample_w), else H * scale_h - pad_out_h by W * scale_w - pad_out_w
      (scale defaults to 2 here, as in SegNet's schema), fixed at setup as in the fork. Zeros,
      with each value written at its flat mask index (the later one wins a shared index);
      backward reads ``bottom_diff[i] = top_diff[mask[i]]``.

    Differs from torch: SegNet's gradient also reaches the losers of a shared index.
    """

    param_field = "upsample_param"
    bottoms = Between(1, 2)
    restrictions = (
        "SegNet fields with one bottom, dims_num with two, scale 0 (an empty top "
        "in brocolli) and an input whose rank is not dims_num are errors; so is a "
        "mask index outside the output (the fork aborts or writes out of bounds)"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        self.segnet = len(bottom_shapes) == 2
        self.has_backward = self.segnet  # brocolli's form has an empty Backward_cpu
        if self.segnet:
            self._setup_segnet(p)
        else:
            given = [f for f in _SEGNET_FIELDS if p.HasField(f)]
            if given:
                raise self.error(
                    "SegNet's upsample fields need the pooling mask as bottom 1",
                    expected="2 bottoms (data, mask)",
                    got=f"1 bottom with {given}",
                )
            if p.dims_num not in (3, 4):
                raise self.error("dims_num must be 3 or 4", expected="3 or 4", got=p.dims_num)
            if p.scale < 1:
                raise self.error("scale must be positive", expected=">= 1", got=p.scale)
        self.output_shapes(self.bottom_shapes)

    def _setup_segnet(self, p) -> None:
        if p.HasField("dims_num"):
            raise self.error(
                "dims_num is brocolli's one-bottom form; SegNet's two-bottom form "
                "upsamples (N, C, H, W)",
                expected="no dims_num",
                got=p.dims_num,
            )
        if not (
            (p.HasField("upsample_h") and p.HasField("upsample_w"))
            or (not p.HasField("scale") and p.HasField("scale_h") and p.HasField("scale_w"))
            or (not p.HasField("scale_h") and not p.HasField("scale_w"))
        ):
            raise self.error(
                "upsample_h & upsample_w are required, else scale OR scale_h & scale_w",
                expected="one way to give the output size",
                got=text_format.MessageToString(p, as_one_line=True),
            )
        shape = self.bottom_shapes[0]
        if len(shape) != 4:
            raise self.error(
                "the input must have 4 axes (num, channels, height, width)",
                expected="4 axes",
                got=shape,
            )
        if p.HasField("upsample_h") and p.HasField("upsample_w"):
            if p.upsample_h <= 1 or p.upsample_w <= 1:
                raise self.error(
                    "upsample_h and upsample_w must be greater than 1",
                    expected="> 1",
                    got=(p.upsample_h, p.upsample_w),
                )
            self.out_hw = (int(p.upsample_h), int(p.upsample_w))
            return
        if p.HasField("scale_h"):
            scale_h, scale_w = p.scale_h, p.scale_w
        else:
            scale_h = scale_w = p.scale if p.HasField("scale") else 2  # SegNet's default
        if scale_h <= 1 or scale_w <= 1:
            raise self.error(
                "the scale must be greater than 1", expected="> 1", got=(scale_h, scale_w)
            )
        for axis, pad, scale in (("h", p.pad_out_h, scale_h), ("w", p.pad_out_w, scale_w)):
            if pad and scale != 2:
                raise self.error(
                    f"pad_out_{axis} requires scale_{axis} == 2, otherwise the "
                    "output size is ill-defined",
                    expected=2,
                    got=scale,
                )
        self.out_hw = (shape[2] * scale_h - int(p.pad_out_h), shape[3] * scale_w - int(p.pad_out_w))

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        if self.segnet:
            mask = tuple(int(d) for d in bottom_shapes[1])
            if len(shape) != 4 or mask != shape:
                raise self.error(
                    "the mask (bottom 1) must have the 4-D shape of the data (bottom 0)",
                    expected=shape,
                    got=mask,
                )
            return [shape[:2] + self.out_hw]
        dims, scale = self.param.dims_num, self.param.scale
        if len(shape) != dims:
            raise self.error(
                f"dims_num {dims} needs a {dims}-D input", expected=f"{dims} axes", got=shape
            )
        return [
            shape[:-2] + (shape[-2] * scale, shape[-1] * scale)
            if dims == 4
            else shape[:-1] + (shape[-1] * scale,)
        ]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.segnet:
            size = self.out_hw[0] * self.out_hw[1]
            assert mask is not None  # the SegNet form has two bottoms
            index = check_mask_range(mask, size, self._range_error)
            return segnet_unpool(x, index, self.out_hw)
        x, scale = x.detach(), self.param.scale
        x = _repeat_each(x, scale, -1)
        return _repeat_each(x, scale, -2) if self.param.dims_num == 4 else x

    def _range_error(self, got):
        return self.error(
            "upsample top index out of range",
            hint="check the scale settings match the input pooling layer's downsample setup",
            expected=f"0 <= index < {self.out_hw[0] * self.out_hw[1]}",
            got=got,
        )


def _repeat_each(x: torch.Tensor, times: int, axis: int) -> torch.Tensor:
    """Each element ``times`` times in a row along ``axis`` (< 0): ``repeat_interleave``
    as an expand and a reshape. torch.onnx's TorchScript exporter infers a wrong static
    shape for repeat_interleave, from which it folds a later ``reshape(n, -1)`` into a
    constant: the graph then fails in onnxruntime (an Upsample, a global pooling and a 1x1
    Convolution, at another batch)."""
    spread = x.unsqueeze(axis).expand(
        *x.shape[: x.dim() + axis + 1], times, *x.shape[x.dim() + axis + 1 :]
    )
    return spread.flatten(axis - 1, axis)
