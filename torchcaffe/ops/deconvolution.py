"""Deconvolution: the transpose of Convolution (Caffe swaps its forward and backward)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import register_layer
from ._conv_geometry import col2im_nd
from .convolution import ConvolutionBase


@register_layer("Deconvolution")
class DeconvolutionLayer(ConvolutionBase):
    """Transposed convolution. Caffe type ``Deconvolution``, ``convolution_param``.

    Output: stride * (in - 1) + (dilation * (kernel - 1) + 1) - 2 * pad per spatial axis.
    Weight blob (channels, num_output / group, *kernel) (torch's conv_transpose layout), bias
    (num_output,). ``force_nd_im2col`` and ``engine`` have no numeric effect.
    Differs from torch: none for 1-3 spatial axes; more spatial axes run through col2im.
    """

    reverse_dimensions = True

    def output_spatial(self, spatial) -> tuple[int, ...]:
        return self.geom.deconv_output(spatial)

    def compute(self, x: torch.Tensor, spatial: tuple[int, ...]) -> torch.Tensor:
        g, n = self.geom, self.geom.num_spatial
        weight = self.weight
        if n == 0:
            y = F.conv_transpose1d(x.unsqueeze(-1), weight.unsqueeze(-1), groups=self.group)
            return self.add_bias(y.squeeze(-1))
        if n > 3:
            # columns = W^T x per group, in Caffe's channel-major layout, then col2im
            w = weight.reshape(self.group, self.channels // self.group, -1)
            xg = x.reshape(x.shape[0], self.group, self.channels // self.group, -1)
            cols = torch.einsum("gcm,ngcl->ngml", w, xg)
            cols = cols.reshape(x.shape[0], -1, *spatial)
            return self.add_bias(col2im_nd(cols, g, self.output_spatial(spatial)))
        deconv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[n - 1]
        stride, pad, dilation = g.torch_args()
        bias = self.bias if self.bias_term else None
        return deconv(x, weight, bias, stride, pad, 0, self.group, dilation)
