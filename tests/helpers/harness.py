"""Build one layer from a prototxt snippet, with seeded bottoms of the given shapes."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from google.protobuf import text_format

from torchcaffe.ops.base import CaffeLayer
from torchcaffe.proto import caffe_pb2
from torchcaffe.registry import layer_class


def layer_param(
    snippet: str = "",
    *,
    type: str | None = None,
    n_bottoms: int = 1,
    n_tops: int = 1,
    phase: str = "TRAIN",
    name: str = "layer",
) -> caffe_pb2.LayerParameter:
    lp = text_format.Parse(snippet, caffe_pb2.LayerParameter())
    if type is not None:
        lp.type = type
    if not lp.name:
        lp.name = name
    if not lp.bottom:
        lp.bottom.extend(f"bottom{i}" for i in range(n_bottoms))
    if not lp.top:
        lp.top.extend(f"top{i}" for i in range(n_tops))
    if not lp.HasField("phase"):
        lp.phase = caffe_pb2.Phase.Value(phase.upper())
    return lp


def make_layer(
    snippet: str = "",
    bottom_shapes: Sequence[Sequence[int]] = ((2, 3, 4, 5),),
    *,
    type: str | None = None,
    n_tops: int = 1,
    phase: str = "TRAIN",
    name: str = "layer",
    seed: int = 1701,
    bottoms: Sequence[torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[CaffeLayer, list[torch.Tensor]]:
    """-> (layer, bottoms). Bottoms are standard normal unless given."""
    lp = layer_param(
        snippet, type=type, n_bottoms=len(bottom_shapes), n_tops=n_tops, phase=phase, name=name
    )
    gen = torch.Generator().manual_seed(seed)
    if bottoms is None:
        bottoms = [
            torch.randn(tuple(s), generator=gen, dtype=torch.float64).to(dtype)
            for s in bottom_shapes
        ]
    torch.manual_seed(seed)
    layer = layer_class(lp.type).from_param(lp, [tuple(b.shape) for b in bottoms])
    return layer.to(dtype), list(bottoms)


def run(layer: CaffeLayer, bottoms: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    out = layer(*bottoms)
    return out if isinstance(out, tuple) else (out,)
