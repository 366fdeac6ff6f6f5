"""Caffe weights under the keys a torch user expects: ``conv1.weight``, ``bn1.running_mean``.

Keys are ``<Caffe layer name>.<blob name>`` (weight, bias, ...). BatchNorm differs from torch:
Caffe stores the running sums ``mean``, ``variance`` and a ``scale_factor`` and divides by it
at use (a factor of 0 gives 0, as Caffe's BatchNormLayer). Here they become torch's
``running_mean = mean / scale_factor`` and ``running_var = variance / scale_factor`` (plus
``num_batches_tracked``), and the learned affine of the Scale layer that follows a BatchNorm
in Caffe becomes that BatchNorm's ``weight`` and ``bias``. Going back writes scale_factor 1.
An InnerProduct with ``transpose: true`` stores its weight (K, N); ``nn.Linear``'s is (N, K),
so it is transposed both ways.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import WeightsError
from ..net.net import TorchNet
from ..ops.base import CaffeLayer

BN_TYPES = ("BatchNorm",)


def _folded_scales(net: TorchNet) -> dict[str, str]:
    """Scale layer -> the BatchNorm whose top it takes (Caffe's BN + Scale pair)."""
    writer: dict[str, tuple[str, str]] = {}  # blob -> (layer name, type) that last wrote it
    folded: dict[str, str] = {}
    for step in net.steps:
        if not isinstance(net.layers[step.key], CaffeLayer):
            step_type = "a user's module"  # its own names: nothing folds into or out of it
        else:
            step_type = step.type
        if step_type == "Scale" and len(step.bottoms) == 1:
            last = writer.get(step.bottoms[0])
            if last is not None and last[1] in BN_TYPES:
                folded[step.name] = last[0]
        for top in step.tops:
            writer[top] = (step.name, step_type)
    folded_bns = list(folded.values())
    return {s: b for s, b in folded.items() if folded_bns.count(b) == 1}


def _linear_layout(module: torch.nn.Module, name: str, blob: torch.Tensor) -> torch.Tensor:
    """``blob`` in torch's layout: a transposed InnerProduct's weight as nn.Linear's (N, K)."""
    return blob.t() if name == "weight" and getattr(module, "transpose", False) is True else blob


def _unshared(module: torch.nn.Module, seen: set[int]) -> tuple[list[str], list[torch.Tensor]]:
    """The layer's blob names and blobs, leaving out those an earlier layer already owns. A
    module a user put in ``net.layers`` in a layer's place: its own ``state_dict`` entries,
    under their torch names (``fc8.1.weight``)."""
    names: list[str] = []
    blobs: list[torch.Tensor] = []
    if isinstance(module, CaffeLayer):
        entries = [(name, getattr(module, name)) for name in module.blob_names]
    else:
        entries = list(module.state_dict(keep_vars=True).items())
    for name, blob in entries:
        if id(blob) not in seen:
            seen.add(id(blob))
            names.append(name)
            blobs.append(blob)
    return names, blobs


@torch.no_grad()
def readable_state_dict(net: TorchNet) -> dict[str, torch.Tensor]:
    """The net's params under readable keys (fresh CPU tensors, no shared storage)."""
    folded = _folded_scales(net)
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()  # params shared by name appear once, under their first layer
    for step in net.steps:
        module = net.layer(step.name)
        names, blobs = _unshared(module, seen)
        blobs = [b.detach().to("cpu").clone() for b in blobs]
        if step.type in BN_TYPES and names[:3] == ["mean", "variance", "scale_factor"]:
            mean, var, factor = blobs[:3]
            f = float(factor.reshape(-1)[0]) if factor.numel() else 1.0
            inv = 0.0 if f == 0 else 1.0 / f
            state[f"{step.name}.running_mean"] = mean * inv
            state[f"{step.name}.running_var"] = var * inv
            state[f"{step.name}.num_batches_tracked"] = torch.tensor(0, dtype=torch.long)
            continue
        prefix = folded.get(step.name, step.name)
        for name, blob in zip(names, blobs):
            key = f"{prefix}.{name}"
            if key in state:
                raise WeightsError(
                    f"two layers map to the key {key!r}",
                    path=net.path,
                    layer=step.name,
                    layer_type=step.type,
                    hint="rename one of the layers",
                )
            state[key] = _linear_layout(module, name, blob).contiguous()
    return state


@torch.no_grad()
def load_readable_state_dict(
    net: TorchNet, state: Mapping[str, torch.Tensor], source: str | None = None
) -> None:
    """Fill ``net``'s params from readable keys; missing or unexpected keys are an error."""
    folded = _folded_scales(net)
    used: set[str] = set()
    missing: list[str] = []

    def take(key: str) -> torch.Tensor | None:
        if key not in state:
            missing.append(key)
            return None
        used.add(key)
        return state[key]

    assignments: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    seen: set[int] = set()
    for step in net.steps:
        module = net.layer(step.name)
        names, blobs = _unshared(module, seen)
        if step.type in BN_TYPES and names[:3] == ["mean", "variance", "scale_factor"]:
            mean, var = take(f"{step.name}.running_mean"), take(f"{step.name}.running_var")
            if f"{step.name}.num_batches_tracked" in state:
                used.add(f"{step.name}.num_batches_tracked")
            if mean is not None and var is not None:
                assignments += [
                    (f"{step.name}.running_mean", blobs[0], mean),
                    (f"{step.name}.running_var", blobs[1], var),
                    (f"{step.name}.scale_factor", blobs[2], torch.ones_like(blobs[2])),
                ]
            continue
        prefix = folded.get(step.name, step.name)
        for name, blob in zip(names, blobs):
            value = take(f"{prefix}.{name}")
            if value is not None:
                value = _linear_layout(module, name, value)
                assignments.append((f"{prefix}.{name}", blob, value))
    unexpected = sorted(set(state) - used)
    if missing or unexpected:
        raise WeightsError(
            "state_dict keys do not fit the net",
            path=source,
            expected=f"keys of net '{net.name}'",
            got=f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}",
        )
    for key, target, value in assignments:
        # only axes of size 1 may differ (a (1,) scalar blob, a legacy 1x1xNxK one): a
        # transposed weight has the same count, and reshaping it would scramble it silently
        if _squeezed(value.shape) != _squeezed(target.shape):
            raise WeightsError(
                f"shape mismatch for {key!r}",
                path=source,
                expected=tuple(target.shape),
                got=tuple(value.shape),
            )
        target.copy_(value.reshape(target.shape).to(target.dtype))


def _squeezed(shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape if d != 1)
