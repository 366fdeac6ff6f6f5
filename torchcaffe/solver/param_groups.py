"""ParamSpec ``lr_mult`` / ``decay_mult`` as torch optimizer param groups.

Caffe keeps one list of learnable params (a shared param appears once, under its owner) with
a rate and a decay multiplier each. Here params with equal multipliers form one group, so a
torch user sees a handful of groups, while ``learnable_params`` keeps Caffe's order for the
.solverstate history. ``param_groups`` is the public helper for any torch optimizer (rates and
decays already multiplied); ``multiplier_groups`` feeds Caffe's own update rules. Blobs that
are torch buffers (BatchNorm statistics) are solver-visible in Caffe with ``lr_mult: 0``; they
stay out of the optimizer (no update either way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..ops.base import CaffeLayer

if TYPE_CHECKING:
    from ..net.net import TorchNet


@dataclass(frozen=True)
class Learnable:
    """One entry of Caffe's ``learnable_params_``."""

    layer: str
    index: int
    tensor: torch.Tensor
    lr_mult: float
    decay_mult: float

    @property
    def optimized(self) -> bool:
        """Whether the optimizer updates it (a Parameter, not a buffer)."""
        return isinstance(self.tensor, nn.Parameter)


def learnable_params(net: TorchNet) -> list[Learnable]:
    """Caffe's learnable params of a compiled net, in Caffe's order. The owner is found by its
    place, not its name: Caffe lets two layers share a name, and trains each one's params.
    A module a user put in ``net.layers`` in a layer's place (a new head to fine-tune) has no
    ParamSpec: its params come after, in layer order, at multipliers 1 (the base rate and
    decay), as a torch optimizer would take them."""
    out = []
    for info in net.param_infos:
        module = net.layers[net.steps[info.step].key]
        if isinstance(module, CaffeLayer):
            tensor = module.param_blobs()[info.index]
            out.append(
                Learnable(
                    info.layer, info.index, tensor, float(info.lr_mult), float(info.decay_mult)
                )
            )
    for step in net.steps:
        module = net.layers[step.key]
        if not isinstance(module, CaffeLayer):
            out += [Learnable(step.name, i, p, 1.0, 1.0) for i, p in enumerate(module.parameters())]
    return out


def multiplier_groups(
    net: TorchNet | list[Learnable], **group_options: Any
) -> list[dict[str, Any]]:
    """Groups for Caffe's own update rules (``CaffeOptimizer``): one per distinct
    (lr_mult, decay_mult), in order of first appearance, carrying the multipliers as
    ``lr_mult`` / ``decay_mult`` keys (the rule applies them in Caffe's float32 arithmetic).

    Every Parameter is kept, ``lr_mult: 0`` included: Caffe still runs the rule on it (its
    history can change, e.g. AdaGrad's with weight decay) and a .solverstate stores that
    history. ``group_options`` (e.g. ``lr=0.01``) are copied into every group.
    """
    entries = net if isinstance(net, list) else learnable_params(net)
    groups: dict[tuple[float, float], dict[str, Any]] = {}
    for entry in entries:
        if not entry.optimized:
            continue
        key = (entry.lr_mult, entry.decay_mult)
        if key not in groups:
            groups[key] = {
                "params": [],
                "lr_mult": entry.lr_mult,
                "decay_mult": entry.decay_mult,
                **group_options,
            }
        groups[key]["params"].append(entry.tensor)
    return list(groups.values())


def param_groups(
    net: TorchNet | list[Learnable],
    lr: float,
    weight_decay: float = 0.0,
    **options: Any,
) -> list[dict[str, Any]]:
    """Param groups for any torch optimizer, with Caffe's ParamSpec multipliers applied.

    Each group holds the params sharing one (lr_mult, decay_mult) and gets
    ``lr = lr * lr_mult`` and ``weight_decay = weight_decay * decay_mult``, so e.g.
    ``torch.optim.AdamW(param_groups(net, lr=1e-4, weight_decay=0.01))`` trains a bias with
    ``lr_mult: 2`` at twice the rate and never decays one with ``decay_mult: 0``. Torch LR
    schedulers scale every group's ``lr`` by the same factor, so the ratios hold throughout.

    Params with ``lr_mult: 0`` are left out (frozen): Caffe never moves them, and a torch
    optimizer would otherwise keep state for them. BatchNorm statistics (buffers) are never
    optimizer params. Each group also records ``multipliers = (lr_mult, decay_mult)`` for
    reading; it is not a key torch or Caffe's update rules act on. ``options`` (e.g.
    ``betas``) are copied into every group.
    """
    groups = []
    for group in multiplier_groups(net):
        lr_mult, decay_mult = group["lr_mult"], group["decay_mult"]
        if lr_mult == 0:
            continue
        groups.append(
            {
                "params": group["params"],
                "lr": lr * lr_mult,
                "weight_decay": weight_decay * decay_mult,
                "multipliers": (lr_mult, decay_mult),
                **options,
            }
        )
    return groups
