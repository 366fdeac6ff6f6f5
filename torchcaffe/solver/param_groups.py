"""ParamSpec ``lr_mult`` / ``decay_mult`` as torch optimizer param groups.

Caffe keeps one list of learnable params (a shared param appears once, under its owner) with
a rate and a decay multiplier each. Here params with equal multipliers form one group, so a
torch user sees a handful of groups, while ``learnable_params`` keeps Caffe's order for the
.solverstate history. Blobs that are torch buffers (BatchNorm statistics) are solver-visible
in Caffe with ``lr_mult: 0``; they stay out of the optimizer (no update either way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

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
    """Caffe's learnable params of a compiled net, in Caffe's order."""
    out = []
    for info in net.param_infos:
        tensor = net.layer(info.layer).param_blobs()[info.index]
        out.append(
            Learnable(info.layer, info.index, tensor, float(info.lr_mult), float(info.decay_mult))
        )
    return out


def param_groups(net: TorchNet | list[Learnable], **group_options: Any) -> list[dict[str, Any]]:
    """Param groups, one per distinct (lr_mult, decay_mult), in order of first appearance.

    ``group_options`` (e.g. ``lr=0.01``) are copied into every group.
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
