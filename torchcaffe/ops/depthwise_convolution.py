"""The MobileNet forks' depthwise convolution types (both read ``convolution_param``).

``DepthwiseConvolution`` (yonghenglh6/DepthwiseConvolution, merged into many MobileNet and
SSD forks) derives from BaseConvolutionLayer: a drop-in type for a grouped Convolution with
the same weights and the same CPU computation. ``ConvolutionDepthwise`` (conv_dw_layer in the
MobileNet-SSD / caffe-ssd forks) is its own layer: one filter per input channel, weight
(C, 1, kh, kw), ``num_output`` and ``group`` ignored.
"""

from __future__ import annotations

from ..registry import register_layer
from ._conv_geometry import ConvGeometry
from .base import Exactly
from .convolution import ConvolutionLayer


@register_layer("DepthwiseConvolution", fork="MobileNet")
class DepthwiseConvolutionLayer(ConvolutionLayer):
    """Fork type ``DepthwiseConvolution``, ``convolution_param``: exactly Convolution
    (weight (num_output, channels / group, *kernel); usually group == channels).

    Differs from torch: as Convolution.
    """


@register_layer("ConvolutionDepthwise", fork="MobileNet")
class ConvolutionDepthwiseLayer(ConvolutionLayer):
    """Fork type ``ConvolutionDepthwise``, ``convolution_param``; (N, C, H, W) bottoms.

    Output: C channels (``num_output`` and ``group`` are ignored), spatial size as Convolution.
    Weight blob (C, 1, kh, kw), bias (C,). Geometry as the fork reads it: ``kernel_h`` and
    ``kernel_w`` only when both are set, else ``kernel_size`` (first value, or first two);
    ``stride`` / ``pad`` / ``dilation`` likewise (absent: 1 / 0 / 1).
    Differs from torch: none (F.conv2d with groups = C).
    """

    bottoms = Exactly(1)
    tops = Exactly(1)

    def setup_geometry(self, shape) -> tuple[ConvGeometry, int, int]:
        p = self.param
        if len(shape) != 4:
            raise self.error(
                "input must have 4 axes (num, channels, height, width)", expected=4, got=len(shape)
            )
        kernel = self._hw(p, "kernel", "kernel_size", None)
        if min(kernel) <= 0:
            raise self.error("filter dimensions must be nonzero", expected="kernel > 0", got=kernel)
        stride = self._hw(p, "stride", "stride", 1)
        if min(stride) <= 0:
            raise self.error("stride dimensions must be nonzero", expected="stride > 0", got=stride)
        pad = self._hw(p, "pad", "pad", 0)
        dilation = self._hw(p, None, "dilation", 1)
        if min(dilation) <= 0:
            raise self.error("dilation must be positive", expected="> 0", got=dilation)
        channels = shape[1]
        return ConvGeometry(1, kernel, stride, pad, dilation), channels, channels

    def _hw(self, p, prefix: str | None, repeated: str, default: int | None) -> tuple[int, int]:
        if prefix and p.HasField(f"{prefix}_h") and p.HasField(f"{prefix}_w"):
            return (getattr(p, f"{prefix}_h"), getattr(p, f"{prefix}_w"))
        values = list(getattr(p, repeated))
        if not values:
            if default is None:
                raise self.error(
                    f"{repeated} (or both {prefix}_h and {prefix}_w) is required",
                    expected=f"{repeated} or {prefix}_h/{prefix}_w",
                    got="none",
                )
            return (default, default)
        return (values[0], values[1] if len(values) > 1 else values[0])
