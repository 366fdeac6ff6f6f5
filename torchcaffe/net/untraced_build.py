"""A net's pass-optimized program, built outside dynamo's trace.

``torch.compile(net)`` traces ``forward``, and ``forward`` looks its program up by key
(``TorchNet._cached_program``). A net never run eagerly has none yet, and dynamo traced the
whole pass pipeline that builds it, bytecode by bytecode: dynamo alone spent 35.5 s on
GoogLeNet's first compiled call instead of 5.4 s (the eager build: 11 ms), 71.8 s instead of
14.3 s with ``dynamic=True``.
The trace also saw the program cache without the key, so the next call, finding it there,
compiled the net a second time.

Here dynamo calls ``build_untraced`` as a constant (``torch.compiler.assume_constant_result``):
it runs as plain Python while the trace is made, and the trace then finds the program in the
cache as it would after an eager run. The net reaches it as a token tensor, whose value dynamo
does not guard (an int or the net itself would be guarded by value or identity), so nets of
one architecture share a graph (``own_forward``) where each holds the program the trace
looked up.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

_NETS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_TOKENS = itertools.count(1)


def new_token(net: Any) -> torch.Tensor:
    """A token naming ``net`` to ``build_untraced`` (a copy of a net gets its own)."""
    token = next(_TOKENS)
    _NETS[token] = net
    return torch.tensor(token)


def build_untraced(token: torch.Tensor, key: Any) -> bool:
    """Build the program for ``key`` of the net ``token`` names, unless it has one, and of
    every other live net of its architecture (its class): the graph traced now serves those
    too once they hold the program, where each would otherwise be compiled again on its
    first call (an ensemble: past ``recompile_limit`` nets, dynamo would run them eagerly)."""
    from torch._dynamo import config  # loaded: dynamo is tracing

    net = _NETS[int(token)]
    dynamic = not config.assume_static_by_default  # ``torch.compile(dynamic=True)``
    for other in list(_NETS.values()):
        if type(other) is type(net):
            other.program_for_key(key)
            if dynamic:
                mark_static_shapes(other)
    return True


def mark_static_shapes(net: Any) -> None:
    """Mark every param and buffer of ``net`` as of static shape, as ``torch._dynamo.mark_static``
    does outside a trace (that function, called inside one, would specialize symbols already
    made). Dynamo gives static shapes to exact ``nn.Parameter``s and to blobs read as module
    attributes, but the passes read a layer's blobs from its dicts (``folding._blob``), and a
    learnable blob is a ``CaffeParameter``: with ``dynamic=True`` each of its sizes became a
    symbol, duck-sized with the image's (Inception-v3: 470 of 564 blobs; a 3x3 kernel's 3 made
    a convolution's output size ``-s40 + ((-s40 + s82)//8) + 1``, which inductor failed to
    lower). Marked here, while the trace is made and before it reads a blob, so a blob that
    ``.to()``, a copy or a load replaced is marked too. A user's own marks are kept. Only for a
    trace that makes every size dynamic (``build_untraced``): otherwise a blob's shape, which
    never changes, is static anyway, and a mark is one more attribute that each call's guards
    compare (MobileNetV2's 320 blobs: 0.55 -> 0.72 ms of guard check a compiled call)."""
    for tensor in itertools.chain(net.parameters(), net.buffers()):
        if tensor.dim() and not any(hasattr(tensor, m) for m in _DYNAMIC_MARKS):
            indices = getattr(tensor, STATIC_MARK, None)
            if indices is None or len(indices) < tensor.dim():
                setattr(tensor, STATIC_MARK, set(range(tensor.dim())))
                tensor._has_dynamo_dim_marking = True  # type: ignore[attr-defined]


# ``torch.compiler.assume_constant_result(build_untraced)``, whose whole effect is this marker,
# which dynamo reads when it meets the function; set here without importing dynamo, and sympy
# with it, which building a net does not need (tests/net/test_compile_cold.py checks that the
# decorator still sets it).
CONSTANT_MARKER = "_dynamo_marked_constant"
setattr(build_untraced, CONSTANT_MARKER, True)

# ``torch._dynamo.mark_static(t)``'s marks (test_compile_static_params.py checks them); a
# tensor with one of dynamo's dynamic marks is the user's to decide.
STATIC_MARK = "_dynamo_static_indices"
_DYNAMIC_MARKS = (
    "_dynamo_dynamic_indices",
    "_dynamo_weak_dynamic_indices",
    "_dynamo_unbacked_indices",
    "_dynamo_strict_unbacked_indices",
)

# Is dynamo tracing? Not torch.export's non-strict tracer, which runs the passes as Python
# itself (torch < 2.3 has no such tracer, nor this function).
dynamo_is_tracing = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)
