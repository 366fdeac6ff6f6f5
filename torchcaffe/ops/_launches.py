"""Where a layer's cost is its kernel launches rather than its arithmetic.

Off the CPU, eagerly, every op is a kernel launch whose host-side cost can exceed the kernel
(small per-channel ops, slice updates, a fold's weight arithmetic): there layers take the
form with the fewest ops. On the CPU, and under torch.compile (which fuses ops into its own
kernels), they take the form that computes fastest.
"""

from __future__ import annotations

import torch


def launch_bound(t: torch.Tensor) -> bool:
    """Whether ops on ``t`` are costed in kernel launches: off the CPU and not traced by
    torch.compile."""
    return not t.is_cpu and not torch.compiler.is_compiling()
