"""Whether a torch.compile trace is one whose params inductor freezes (its ``freezing``).

Without freezing a compiled graph takes the params as inputs, so our CPU paths keep what
derives from them out of the graph: opaque ops with weights folded and packed once
(``opaque_conv``, ``onednn_linear``), and a folded BatchNorm applied after the convolution.
With freezing, inductor takes the params as constants: it computes the folded weights once,
packs every convolution's and product's weight, and fuses the ReLU or sum after it into
oneDNN's call. Our opaque ops, and the GEMM forms of 1x1 convolutions (``conv2d``), would
only hide the layers from it, so a frozen trace gets ``F.conv2d`` / ``F.linear`` over weights
folded in the graph. ResNet-50 batch 1 frozen, 2 threads, median of 11: 75.8 ms against the
hand-written model's 48.2 ms while a filled constant in ``batch_norm.scaled_stats`` still
kept the folds per-call work; 42.0 against 42.2 ms now, the same oneDNN calls on both sides.
"""

from __future__ import annotations

import torch

from ._exporting import exporting


def _inductor_freezes() -> bool:
    """Inductor's ``freezing`` setting, read in the trace: dynamo guards the value, so the
    graph compiles again when it changes."""
    from torch._inductor import config

    return config.freezing


def params_frozen() -> bool:
    """Under torch.compile (not torch.export), with no autograd recording, and inductor's
    ``freezing`` on: the graph's params are constants to inductor."""
    if not torch.compiler.is_compiling() or exporting():
        return False
    return not torch.is_grad_enabled() and _inductor_freezes()
