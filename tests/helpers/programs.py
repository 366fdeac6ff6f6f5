"""The layer-by-layer program's blobs, the reference the passes are compared with."""

from __future__ import annotations

import torch

import torchcaffe


def literal_blobs(net: torchcaffe.TorchNet, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every blob of ``net`` fed ``data=x``, with the passes off (copies: in-place layers
    would otherwise leave later values in them)."""
    net.optimize = False
    try:
        with torch.no_grad():
            return {k: v.clone() for k, v in net.forward_all_blobs(data=x).items()}
    finally:
        net.optimize = True
