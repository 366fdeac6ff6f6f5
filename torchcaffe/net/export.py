"""``torch.export`` of a compiled net with a dynamic batch dimension.

``TorchNet.forward`` takes its blobs as ``*args`` / ``**inputs``; torch 2.13's export
matches a ``dynamic_shapes`` dict against var-keyword inputs inconsistently (its own
check wants the key ``inputs``, its constraint solver then looks the blobs up by name and
fails). Passing the inputs positionally, in the net's input order, avoids that:
``export_net`` does it, and the exported module is called the same way
(``ep.module()(*tensors)``, returning the same dict of output blobs).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence

import torch

from ..errors import BlobWiringError, ExportError, TorchCaffeError
from .net import TorchNet


def batch_groups(net: TorchNet, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """The inputs whose axis 0 a dynamic-batch export makes symbolic, each with the example
    size it has there. Inputs of one size share one symbolic size (a data blob and its
    label). An input of another size gets its own where the net reshapes for it (a Crop's
    reference, a detector's ROIs: Caffe's Net::Reshape at one more there) and stays fixed
    where a layer refuses that (a Bias or Scale blob given as a bottom), as does an input
    whose axis 0 is 1 beside others' larger one (an LSTM's (1, N, H) initial state). The
    first input's size must be free to change: where a layer fixes it (an LSTM's
    timesteps, a Slice into equal parts) that layer is named here, not in a torch error."""
    sizes = {n: int(s[0]) for n, s in shapes.items() if len(s)}
    candidates = {n: d for n, d in sizes.items() if d > 1 or max(sizes.values(), default=0) <= 1}
    groups: dict[str, int] = {}
    for size in dict.fromkeys(candidates.values()):
        members = [n for n, d in candidates.items() if d == size]
        other = {n: (size + 1, *s[1:]) if n in members else tuple(s) for n, s in shapes.items()}
        try:
            net.infer_shapes(other)
        except TorchCaffeError as err:
            if net.input_names[0] not in members:
                continue  # fixed at the example's size
            raise ExportError(
                f"cannot export with a dynamic batch (axis 0 of {members}): at another size "
                f"there, {err.what}",
                path=net.path,
                layer=err.layer,
                layer_type=err.layer_type,
                expected=err.expected,
                got=err.got,
                hint="export with dynamic_batch=False (the example's shapes)",
            ) from err
        groups.update(dict.fromkeys(members, size))
    return groups


@contextlib.contextmanager
def state_kept(net: TorchNet) -> Iterator[None]:
    """Within: what an export's trace runs may change the net's state (a recurrent layer's
    carried hidden state, a BatchNorm's statistics): every buffer and param is put back as
    it was, the same tensor objects with the same values, so the net's next forward computes
    what it would have without the export. Holds a copy of them meanwhile."""
    buffers = [
        (m, name, t, t.detach().clone())
        for m in net.modules()
        for name, t in m._buffers.items()
        if t is not None
    ]
    params = [(p, p.detach().clone()) for p in net.parameters()]
    try:
        yield
    finally:
        with torch.no_grad():
            for module, name, tensor, value in buffers:
                module._buffers[name] = tensor
                tensor.copy_(value)
            for param, value in params:
                param.copy_(value)


@contextlib.contextmanager
def registration_hooks_kept() -> Iterator[None]:
    """Within: a global buffer-registration hook that torch.export leaves behind is removed
    on the way out. Torch 2.10 to 2.12 remove the one their non-strict trace registers only
    when the trace succeeds; left after a failed export, it made every later torch.compile
    of a net that sets a buffer in its forward (a recurrent layer's carried state) fail
    with ``fullgraph=True``, and break its graph otherwise."""
    hooks = getattr(torch.nn.modules.module, "_global_buffer_registration_hooks", None)
    before = set(hooks) if hooks is not None else set()
    try:
        yield
    finally:
        if hooks is not None:
            for key in set(hooks) - before:
                del hooks[key]


def batch_axis_names(groups: Mapping[str, int]) -> dict[str, str]:
    """Each symbolic input's name for its axis 0 (``batch_groups``): ``batch`` for the first
    input's group, ``batch1``, ``batch2``... for the others."""
    order = list(dict.fromkeys(groups.values()))
    return {n: f"batch{order.index(size) or ''}" for n, size in groups.items()}


def export_net(
    net: TorchNet,
    inputs: Mapping[str, torch.Tensor],
    *,
    dynamic_batch: bool = True,
    max_batch: int = 1 << 16,
) -> torch.export.ExportedProgram:
    """``torch.export.export`` of ``net`` for these example inputs (by blob name).

    With ``dynamic_batch`` axis 0 of the inputs is symbolic (``batch_groups``), so the
    exported program runs at any batch; other axes stay as in the example. Examples of
    batch 1 are traced as batch 2 (each repeated): torch.export specializes a size of 1 to a
    constant and would refuse the dynamic batch; the program runs at batch 1 all the same.
    A net torch cannot trace so raises ``ExportError``, with torch's reason."""
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
        groups = batch_groups(net, {n: tuple(a.shape) for n, a in zip(net.input_names, args)})
        names = batch_axis_names(groups)
        dims = {name: torch.export.Dim(name, min=1, max=max_batch) for name in names.values()}
        shapes = {"args": tuple({0: dims[names[n]]} if n in names else {} for n in net.input_names)}
    try:
        with state_kept(net), registration_hooks_kept():
            return torch.export.export(net, args, dynamic_shapes=shapes)
    except TorchCaffeError:
        raise
    except Exception as err:  # torch.export raises many kinds; one clear line, the cause kept
        raise ExportError(
            f"torch.export failed: {type(err).__name__}: {first_line(err)}",
            path=net.path,
            hint="a layer whose top's size depends on the values (detections, proposals) "
            "cannot be traced; others may export with dynamic_batch=False",
        ) from err


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(err: Exception) -> str:
    """The line of a torch export error that says what failed: torch.export's errors open
    with boilerplate (terminal colours included) and give the cause under "## Exception
    summary"."""
    lines = [line.strip() for line in _ANSI.sub("", str(err)).splitlines()]
    if "## Exception summary" in lines:
        cause = [line for line in lines[lines.index("## Exception summary") + 1 :] if line]
        if cause:
            return cause[0]
    return next((line for line in lines if line), "")
