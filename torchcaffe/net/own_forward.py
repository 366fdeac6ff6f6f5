"""One ``forward`` code object per net architecture, so that distinct nets do not share dynamo's
recompile budget, and nets of one architecture share a class.

Dynamo keeps the graphs it compiles for a frame on the frame's code object and allows a code
object ``torch._dynamo.config.recompile_limit`` (8) of them. Every net built from the one
``TorchNet`` class would run the one ``TorchNet.forward`` code, so eight distinct nets (or
input shapes) compiled in a process used up that budget, and the ninth net ran eagerly with
only dynamo's warning. A hand-written model does not meet this: each class has its own
``forward``. Here each architecture (``architecture`` below: the net's text and state) gets a
class of its own, a subclass of its class whose ``forward`` is a copy with a fresh code object;
the subclass keeps the name, and pickles as its base. Nets of one architecture (loaded twice, a
copy, an ensemble) share it as instances of one hand-written class do: a graph compiled for
one serves the others, and ``torch.func.stack_module_state``, which wants one class, stacks
them.

The copy's code is also named for its architecture (``forward_<8 hex digits>``, as
tracebacks and profiles show it): dynamo keeps what it learns about a frame's inputs between
calls (automatic dynamic) by the code's file, first line and name, and with one name every
net shared it. A second net compiled in a process then had its image sizes symbolic from its
first call, because the first net's sizes differed, and its Eltwise coefficients became graph
inputs where they differed, as a second instance of one hand-written class would have them.
"""

from __future__ import annotations

import hashlib
import types
import weakref
from collections.abc import Hashable
from typing import Any, TypeVar, cast

from torch import nn

from ..proto import caffe_pb2

M = TypeVar("M", bound=nn.Module)

# Marks a per-net class and names the class it was made from.
_BASE = "_own_forward_base"
# (base class, architecture) -> the class made for it, while some net still is one
_MADE: weakref.WeakValueDictionary[tuple[type, Hashable], type] = weakref.WeakValueDictionary()


def architecture(net_param: caffe_pb2.NetParameter, state: caffe_pb2.NetState) -> bytes:
    """A digest of what a net is built from, less any weights its layers carry (a binary net
    definition's): the net text and the state (phase, level, stages) that picks its layers."""
    if any(len(layer.blobs) for layer in net_param.layer) or any(
        len(layer.blobs) for layer in net_param.layers
    ):
        stripped = caffe_pb2.NetParameter()
        stripped.CopyFrom(net_param)
        for layer in (*stripped.layer, *stripped.layers):
            layer.ClearField("blobs")
        net_param = stripped
    digest = hashlib.blake2b(net_param.SerializeToString(deterministic=True), digest_size=16)
    digest.update(state.SerializeToString(deterministic=True))
    return digest.digest()


def base_class(cls: type[M]) -> type[M]:
    """The class a per-net class was made from (``cls`` itself otherwise)."""
    return cast("type[M]", cls.__dict__.get(_BASE, cls))


def new_instance(cls: type[M]) -> M:
    """An uninitialized ``cls``, for pickle: what ``copyreg.__newobj__`` makes, for a class that
    need not be the pickled object's own."""
    return cls.__new__(cls)


def with_own_forward(cls: type[M], arch: Hashable) -> type[M]:
    """A subclass of ``base_class(cls)`` whose ``forward`` runs a code object of its own, the
    one made for architecture ``arch`` while a net of it lives."""
    base = base_class(cls)
    made = _MADE.get((base, arch))
    if made is not None:
        return cast("type[M]", made)
    shared = base.forward
    # dynamo keeps its graphs on the code object, and what it learnt of the frame (which
    # sizes and floats changed between calls: automatic dynamic) under the code's file,
    # first line and name, so the name differs per architecture too
    tag = hashlib.blake2b(repr(arch).encode(), digest_size=4).hexdigest()
    code = shared.__code__.replace(co_name=f"{shared.__name__}_{tag}")
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
    _MADE[(base, arch)] = made
    return cast("type[M]", made)
