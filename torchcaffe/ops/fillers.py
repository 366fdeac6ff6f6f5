"""Caffe's weight fillers (filler.hpp), drawing from torch's RNG.

The distributions, fan computations and error cases are Caffe's; the random stream is torch's
(``caffe.set_random_seed`` seeds it), so values match Caffe in law, not bit for bit.
"""

from __future__ import annotations

import math

import torch

from ..errors import LayerParamError
from ..proto import caffe_pb2

FILLER_TYPES = (
    "constant",
    "gaussian",
    "positive_unitball",
    "uniform",
    "xavier",
    "msra",
    "bilinear",
)


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    count = math.prod(shape)
    fan_in = count // shape[0]
    fan_out = count // shape[1] if len(shape) > 1 else count
    return fan_in, fan_out


def _variance_n(param: caffe_pb2.FillerParameter, shape: tuple[int, ...]) -> float:
    fan_in, fan_out = _fans(shape)
    if param.variance_norm == caffe_pb2.FillerParameter.AVERAGE:
        return (fan_in + fan_out) / 2.0
    if param.variance_norm == caffe_pb2.FillerParameter.FAN_OUT:
        return float(fan_out)
    return float(fan_in)


def check_filler(param: caffe_pb2.FillerParameter) -> None:
    """Reject what Caffe's GetFiller / Fill would reject, before any tensor exists."""
    if param.type not in FILLER_TYPES:
        raise LayerParamError(
            f"unknown filler type {param.type!r}", expected=" / ".join(FILLER_TYPES), got=param.type
        )
    if param.sparse < -1:
        raise LayerParamError("filler sparse must be >= -1", expected=">= -1", got=param.sparse)
    if param.sparse != -1 and param.type != "gaussian":
        raise LayerParamError(
            f"sparsity is not supported by the {param.type!r} filler",
            expected="sparse: -1",
            got=param.sparse,
        )
    # caffe_rng_gaussian's CHECK_GT(sigma, 0) and caffe_rng_uniform's CHECK_LE(a, b): Caffe
    # fills at setup even when the weights file holds the blob, so these abort any net
    if param.type == "gaussian" and not param.std > 0:
        raise LayerParamError(
            "the gaussian filler needs a positive std", expected="std > 0", got=param.std
        )
    if param.type == "uniform" and not param.min <= param.max:
        raise LayerParamError(
            "the uniform filler needs min <= max",
            expected="min <= max",
            got=(param.min, param.max),
        )


@torch.no_grad()
def fill_(tensor: torch.Tensor, param: caffe_pb2.FillerParameter) -> torch.Tensor:
    """Fill ``tensor`` in place as Caffe's filler ``param.type`` would; returns it."""
    check_filler(param)
    shape = tuple(tensor.shape)
    if tensor.numel() == 0:
        raise LayerParamError("cannot fill an empty blob", expected="count > 0", got=shape)
    kind = param.type
    if kind == "constant":
        tensor.fill_(param.value)
    elif kind == "uniform":
        tensor.uniform_(param.min, param.max)
    elif kind == "gaussian":
        tensor.normal_(param.mean, param.std)
        if param.sparse >= 0:
            p = param.sparse / shape[0]
            if p > 1:
                raise LayerParamError(
                    "gaussian filler sparse exceeds the number of outputs",
                    expected=f"sparse <= {shape[0]}",
                    got=param.sparse,
                )
            tensor.mul_(torch.bernoulli(torch.full_like(tensor, p)))
    elif kind == "positive_unitball":
        tensor.uniform_(0, 1)
        rows = tensor.view(shape[0], -1)
        rows.div_(rows.sum(dim=1, keepdim=True))
    elif kind == "xavier":
        scale = math.sqrt(3.0 / _variance_n(param, shape))
        tensor.uniform_(-scale, scale)
    elif kind == "msra":
        tensor.normal_(0.0, math.sqrt(2.0 / _variance_n(param, shape)))
    elif kind == "bilinear":
        _bilinear_(tensor)
    return tensor


def _bilinear_(tensor: torch.Tensor) -> None:
    if tensor.dim() != 4:
        raise LayerParamError(
            "the bilinear filler needs a 4-D blob", expected=4, got=tuple(tensor.shape)
        )
    height, width = tensor.shape[2], tensor.shape[3]
    if height != width:
        raise LayerParamError(
            "the bilinear filler needs a square kernel",
            expected="kernel_h == kernel_w",
            got=(height, width),
        )
    # Caffe computes in Dtype: for a float blob c, x / f, the differences and the product are
    # each rounded to float, which moves kernels such as 5, 6 or 10 by an ulp from the exact value
    dtype = torch.float64 if tensor.dtype == torch.float64 else torch.float32
    f = math.ceil(width / 2.0)
    c = torch.tensor((width - 1) / (2.0 * f), dtype=dtype)
    x = torch.arange(width, dtype=dtype)
    w1 = 1 - (x / f - c).abs()
    kernel = (w1[:, None] * w1[None, :]).to(tensor.dtype)
    tensor.copy_(kernel.expand_as(tensor))
