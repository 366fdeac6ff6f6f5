"""``torch.export`` of a compiled net with a dynamic batch dimension.

``TorchNet.forward`` takes its blobs as ``*args`` / ``**inputs``; torch 2.13's export
matches a ``dynamic_shapes`` dict against var-keyword inputs inconsistently (its own
check wants the key ``inputs``, its constraint solver then looks the blobs up by name and
fails). Passing the inputs positionally, in the net's input order, avoids that:
``export_net`` does it, and the exported module is called the same way
(``ep.module()(*tensors)``, returning the same dict of output blobs).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import BlobWiringError
from .net import TorchNet


def export_net(
    net: TorchNet,
    inputs: Mapping[str, torch.Tensor],
    *,
    dynamic_batch: bool = True,
    max_batch: int = 1 << 16,
) -> torch.export.ExportedProgram:
    """``torch.export.export`` of ``net`` for these example inputs (by blob name).

    With ``dynamic_batch`` axis 0 of every input is one symbolic size (batch 1 and up), so
    the exported program runs at any batch; other axes stay as in the example. Examples of
    batch 1 are traced as batch 2 (each repeated): torch.export specializes a size of 1 to a
    constant and would refuse the dynamic batch; the program runs at batch 1 all the same."""
    missing = [n for n in net.input_names if n not in inputs]
    extra = [n for n in inputs if n not in net.input_names]
    if missing or extra:
        raise BlobWiringError(
            "export needs exactly the net's input blobs",
            path=net.path,
            expected=net.input_names,
            got=sorted(inputs),
        )
    args = tuple(inputs[n] for n in net.input_names)
    shapes = None
    if dynamic_batch:
        if all(a.dim() and a.shape[0] == 1 for a in args):
            args = tuple(torch.cat([a, a]) for a in args)
        batch = torch.export.Dim("batch", min=1, max=max_batch)
        shapes = {"args": tuple({0: batch} for _ in args)}
    return torch.export.export(net, args, dynamic_shapes=shapes)
