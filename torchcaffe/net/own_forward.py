"""One ``forward`` code object per net, so that each net has dynamo's recompile budget to itself.

Dynamo keeps the graphs it compiles for a frame on the frame's code object and allows a code
object ``torch._dynamo.config.recompile_limit`` (8) of them. Every net built from the one
``TorchNet`` class would run the one ``TorchNet.forward`` code, so eight distinct nets (or
input shapes) compiled in a process used up that budget, and the ninth net ran eagerly with
only dynamo's warning. A hand-written model does not meet this: each class has its own
``forward``. Here each net gets a class of its own, a subclass of its class whose ``forward`` is
a copy with a fresh code object; the subclass keeps the name, and pickles as its base.
"""

from __future__ import annotations

import types
from typing import Any, TypeVar, cast

from torch import nn

M = TypeVar("M", bound=nn.Module)

# Marks a per-net class and names the class it was made from.
_BASE = "_own_forward_base"


def base_class(cls: type[M]) -> type[M]:
    """The class a per-net class was made from (``cls`` itself otherwise)."""
    return cast("type[M]", cls.__dict__.get(_BASE, cls))


def new_instance(cls: type[M]) -> M:
    """An uninitialized ``cls``, for pickle: what ``copyreg.__newobj__`` makes, for a class that
    need not be the pickled object's own."""
    return cls.__new__(cls)


def with_own_forward(cls: type[M]) -> type[M]:
    """A subclass of ``base_class(cls)`` whose ``forward`` runs a code object of its own."""
    base = base_class(cls)
    shared = base.forward
    code = shared.__code__.replace()  # an equal copy: dynamo's cache lives on the object
    own = types.FunctionType(
        code, shared.__globals__, shared.__name__, shared.__defaults__, shared.__closure__
    )
    own.__kwdefaults__ = shared.__kwdefaults__
    own.__qualname__ = shared.__qualname__
    own.__doc__ = shared.__doc__
    own.__module__ = shared.__module__
    own.__annotations__ = dict(shared.__annotations__)
    namespace: dict[str, Any] = {
        "forward": own,
        _BASE: base,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
    }
    made = types.new_class(base.__name__, (base,), {}, lambda ns: ns.update(namespace))
    return cast("type[M]", made)
