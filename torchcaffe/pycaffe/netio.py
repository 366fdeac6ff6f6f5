"""Glue between the Caffe-face Net and the torch face: build, weights, batched forward."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..api import load, load_weights, save_weights
from ..errors import BlobWiringError

if TYPE_CHECKING:
    from .net import Net

__all__ = ["build_torch_net", "load_weights", "save_weights", "forward_all"]


def build_torch_net(network_file: Any, phase: Any, **options: Any):
    return load(network_file, None, phase, **options)


def forward_all(
    net: Net, blobs: Sequence[str] | None, kwargs: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """pycaffe's forward_all: split inputs into net-sized batches, pad the last one.

    Blobs without a batch axis (a scalar loss) come back as one value per forward, where
    pycaffe itself would fail to concatenate them.
    """
    per_batch: set[str] = set()
    outputs = list(net.outputs) + list(blobs or [])
    results: dict[str, list[np.ndarray]] = {name: [] for name in outputs}
    inputs = {k: np.asarray(v) for k, v in kwargs.items()}
    if not inputs:
        out = net.forward(blobs=blobs)
        return {k: v.copy() for k, v in out.items()}
    sizes = {len(v) for v in inputs.values()}
    if len(sizes) != 1:
        raise BlobWiringError(
            "forward_all inputs have different batch counts",
            got={k: len(v) for k, v in inputs.items()},
        )
    total = sizes.pop()
    batch = net.blobs[net.inputs[0]].shape[0]
    for first in range(0, total, batch):
        chunk = {}
        for name, value in inputs.items():
            part = value[first : first + batch]
            pad = batch - len(part)
            if pad:
                part = np.concatenate([part, np.zeros((pad,) + part.shape[1:], part.dtype)])
            chunk[name] = part
        out = net.forward(blobs=blobs, **chunk)
        for name in outputs:
            value = out[name].copy()
            if value.ndim and value.shape[0] == batch:
                results[name].extend(value)
            else:  # a per-batch value (a scalar loss): one entry per forward
                per_batch.add(name)
                results[name].append(value)
    return {name: np.asarray(v if name in per_batch else v[:total]) for name, v in results.items()}
