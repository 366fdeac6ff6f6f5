"""Caffe-style finite-difference gradient checker for one layer (float64 by default).

Objective: 1/2 * sum over tops of top^2 (or one top element when ``top_index`` is given), with
central differences. Tolerance: ``threshold * max(|analytic|, |numeric|, 1)``. Points whose
value lies within ``kink_range`` of ``kink`` are skipped (non-differentiable points).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import torch

from .harness import run


def _objective(layer, bottoms, top_index, seed, buffers):
    with torch.no_grad():  # forward may update running statistics: start from the same ones
        for name, buf in layer.named_buffers():
            buf.copy_(buffers[name])
    torch.manual_seed(seed)
    tops = run(layer, bottoms)
    if top_index is None:
        return sum(0.5 * (t.double() ** 2).sum() for t in tops)
    which, flat = top_index
    return tops[which].reshape(-1)[flat].double()


def check_layer_gradient(
    layer,
    bottoms: Sequence[torch.Tensor],
    *,
    step: float = 1e-2,
    threshold: float = 1e-3,
    kink: float = 0.0,
    kink_range: float = -1.0,
    check: Iterable[str] = ("bottoms", "params"),
    top_index: tuple[int, int] | None = None,
    seed: int = 1701,
    bottom_indices: Iterable[int] | None = None,
    dtype: torch.dtype = torch.float64,
    max_points: int | None = None,
) -> None:
    """Raise AssertionError naming layer/top/blob/index when analytic != numeric gradient."""
    layer = copy.deepcopy(layer).to(dtype)
    buffers = {n: b.detach().clone() for n, b in layer.named_buffers()}
    bottoms = [b.detach().to(dtype).clone() for b in bottoms]
    check = set(check)
    which = range(len(bottoms)) if bottom_indices is None else bottom_indices
    blobs = []
    if "bottoms" in check:
        blobs += [(f"bottom {i}", bottoms[i]) for i in which]
    if "params" in check:
        blobs += [
            (f"param {i}", p)
            for i, p in enumerate(layer.param_blobs())
            if isinstance(p, torch.nn.Parameter)
        ]
    leaves = []
    for _, t in blobs:
        t.requires_grad_(True)
        leaves.append(t)
    if not leaves:
        raise AssertionError(f"layer '{layer.name}': nothing to check")
    obj = _objective(layer, bottoms, top_index, seed, buffers)
    analytic = torch.autograd.grad(obj, leaves, allow_unused=True)
    gen = torch.Generator().manual_seed(seed)
    for (label, blob), grad in zip(blobs, analytic):
        grad = torch.zeros_like(blob) if grad is None else grad
        flat, gflat = blob.data.view(-1), grad.reshape(-1)
        points = range(flat.numel())
        if max_points is not None and flat.numel() > max_points:
            points = torch.randperm(flat.numel(), generator=gen)[:max_points].tolist()
        for k in points:
            x = float(flat[k])
            if kink_range > 0 and kink - kink_range <= abs(x) <= kink + kink_range:
                continue
            with torch.no_grad():
                flat[k] = x + step
                pos = float(_objective(layer, bottoms, top_index, seed, buffers))
                flat[k] = x - step
                neg = float(_objective(layer, bottoms, top_index, seed, buffers))
                flat[k] = x
            numeric = (pos - neg) / (2 * step)
            a = float(gflat[k])
            scale = max(abs(a), abs(numeric), 1.0)
            if abs(a - numeric) > threshold * scale:
                tops = "all tops" if top_index is None else f"top {top_index}"
                raise AssertionError(
                    f"layer '{layer.name}' ({layer.caffe_type}), {tops}, {label}, flat index "
                    f"{k}: analytic {a:.6g} vs numeric {numeric:.6g} (x={x:.6g}, "
                    f"objective+={pos:.8g}, objective-={neg:.8g}, step={step})"
                )
