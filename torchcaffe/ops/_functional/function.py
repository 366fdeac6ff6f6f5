"""The base of torch.func-form autograd.Functions (``forward`` without ctx, ``setup_context``):
their ``apply`` leaves out torch's binding of the arguments to ``forward``'s signature.

For a Function that defines ``setup_context``, torch's ``Function.apply`` runs
``inspect.signature(cls.forward).bind(...)`` on every call, to fill in default arguments
before ``setup_context`` sees them: 30 us of host time a call where the call itself takes
11-17 (torch 2.13, a one-op Function on a 4-element tensor). A forward whose parameters are
positional and without defaults binds every call to its arguments as given, so for those
calls the binding is skipped; under a torch.func transform, or for any other call, torch's
``apply`` runs as it is. An LSTM makes one such call per time step, an in-place neuron
layer (``SlopeAtOutput``) one per training forward; a GPU's eager run is bound by such host
work.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch._functorch.utils import unwrap_dead_wrappers

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
# per class: (fixed positional parameters, whether *args follows), or None where binding
# may change the arguments (defaults, keyword-only parameters, **kwargs)
_ARITY: dict[type, tuple[int, bool] | None] = {}


def _arity(cls: type) -> tuple[int, bool] | None:
    try:
        return _ARITY[cls]
    except KeyError:
        pass
    params = list(inspect.signature(cls.forward).parameters.values())  # type: ignore[attr-defined]
    varargs = bool(params) and params[-1].kind is inspect.Parameter.VAR_POSITIONAL
    fixed = params[:-1] if varargs else params
    plain = all(p.kind in _POSITIONAL and p.default is inspect.Parameter.empty for p in fixed)
    arity = _ARITY[cls] = (len(fixed), varargs) if plain else None
    return arity


class CaffeFunction(torch.autograd.Function):
    """An ``autograd.Function`` in torch.func's form whose ``apply`` skips the per-call
    signature binding where it changes nothing (see the module's docstring)."""

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        arity = _arity(cls)
        if (
            kwargs
            or arity is None
            or torch._C._are_functorch_transforms_active()
            or len(args) < arity[0]
            or (len(args) > arity[0] and not arity[1])
        ):
            return super().apply(*args, **kwargs)
        # what torch's apply does after the binding, outside a transform
        return super(torch.autograd.Function, cls).apply(*unwrap_dead_wrappers(args))  # type: ignore[misc]
