"""Whether torch.export (not torch.compile) is tracing the current call.

``torch.compiler.is_exporting()`` is the public question, but the dynamo of torch 2.11
answers True in every trace it makes, torch.compile's too (its table of tracing-state
functions held the constant True; 2.12 and later read the flag there instead). Under such a
torch every compiled graph took its export form: no opaque oneDNN ops, and LRN's autograd
backward instead of Caffe's. The flag that function returns is read directly where torch
has it, which dynamo reads as the value it holds while it traces.
"""

from __future__ import annotations

import torch

_HAS_FLAG = hasattr(torch.compiler, "_is_exporting_flag")


def exporting() -> bool:
    """torch.compiler.is_exporting(), right under torch.compile on every torch."""
    if _HAS_FLAG:
        return bool(torch.compiler._is_exporting_flag)
    return torch.compiler.is_exporting()
