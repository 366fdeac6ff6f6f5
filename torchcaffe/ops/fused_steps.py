"""Version bumps after torch's fused optimizer steps.

Folded weights, packed convolution weights and a BatchNorm's scaled statistics are kept until
a param's version counter or storage changes (``ops/_derived.py``). A ``fused=True`` torch
optimizer (SGD, Adam, AdamW, Adagrad) writes its params in place through one kernel that
bumps no version counter (torch 2.13: ``p._version`` is the same after ``step``), so the
next inference would run the weights from before the step, silently. A global step
post-hook, installed when the first net is built, bumps the versions of the params of every
fused group after each step, as ``torch.autograd.graph.increment_version`` is meant for.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.graph import increment_version
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

_HANDLE: list[RemovableHandle] = []


def install() -> None:
    """Register the hook once per process."""
    if not _HANDLE:
        _HANDLE.append(register_optimizer_step_post_hook(_bump_fused_params))


def _bump_fused_params(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for group in optimizer.param_groups:
        if group.get("fused"):
            increment_version(group["params"])
