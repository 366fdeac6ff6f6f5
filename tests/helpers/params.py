"""Seeded param values for a built net: reproducible, and chosen per test so that BatchNorm
variances stay positive and activations stay in range."""

from __future__ import annotations

from collections.abc import Callable

import torch

from torchcaffe.net.net import TorchNet

Values = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def fill_params(net: TorchNet, values: Values, seed: int = 0) -> None:
    """Every param blob of ``net``, in layer order, set to ``values(blob, generator)``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in net.layers.values():
            for t in module.param_blobs():
                t.copy_(values(t, gen))


def centered_weights(scale: float) -> Values:
    """Weights (blobs of 2+ axes) uniform in [-scale/2, scale/2), vectors (biases, BatchNorm
    statistics, Scale factors) uniform in [0.5, 1.5): positive variances, activations near 1."""

    def values(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        v = torch.rand(t.shape, generator=gen) + 0.5
        return (v - 1.0) * scale if t.dim() > 1 else v

    return values
