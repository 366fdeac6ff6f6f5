"""The base of torch.func-form autograd.Functions (``forward`` without ctx, ``setup_context``):
outside a torch.func transform their ``apply`` leaves out torch's binding of the arguments to
``forward``'s signature.

For a Function that defines ``setup_context``, torch's ``apply`` runs
``inspect.signature(cls.forward).bind(...)`` on every call, to fill in default arguments
before ``setup_context`` sees them: 30 us of host time a call where the call itself takes
11-17 (torch 2.13, a one-op Function on a 4-element tensor; torch 2.14 moved ``apply`` into
C++, which still calls that Python binding). A forward whose parameters are positional and
without defaults binds every call to its arguments as given, so for those calls the class
runs as its ctx-form twin (``forward(ctx, *args)`` calling ``forward`` and then
``setup_context``), which torch applies without binding anything. Under a torch.func
transform, which needs the torch.func form, or while dynamo traces, or for any other call,
torch's ``apply`` runs as it is. An LSTM makes one such call per time step, an in-place
neuron layer (``SlopeAtOutput``) one per training forward; a GPU's eager run is bound by such
host work.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

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
            or torch.compiler.is_compiling()
            or len(args) < arity[0]
            or (len(args) > arity[0] and not arity[1])
        ):
            return super().apply(*args, **kwargs)
        return _ctx_form(cls).apply(*args)


# per class: its ctx-form twin (``_ctx_form``)
_CTX_FORMS: dict[type, type[torch.autograd.Function]] = {}


def _ctx_form(cls: type[CaffeFunction]) -> type[torch.autograd.Function]:
    """``cls`` as a ctx-form Function of the same name: ``forward(ctx, *args)`` runs
    ``cls.forward(*args)`` and then ``cls.setup_context`` on what it returned, as torch's
    apply does for ``cls`` itself; backward, and jvp where ``cls`` has one, are ``cls``'s."""
    made = _CTX_FORMS.get(cls)
    if made is not None:
        return made
    forward, setup_context = cls.forward, cls.setup_context

    def forward_and_setup(ctx: Any, *args: Any) -> Any:
        output = forward(*args)
        setup_context(ctx, args, output)
        return output

    namespace: dict[str, Any] = {
        "forward": staticmethod(forward_and_setup),
        "backward": staticmethod(cls.backward),
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
    }
    if cls.jvp is not torch.autograd.Function.jvp:  # ``with_jvp``'s subclass
        namespace["jvp"] = staticmethod(cls.jvp)
    made = _CTX_FORMS[cls] = type(cls.__name__, (torch.autograd.Function,), namespace)
    return made
