"""Param blobs whose writes through ``.data`` the net's caches see.

Inference keeps tensors derived from the params (folded weights, oneDNN's packed weights,
whether the params are finite) until a param's version counter or storage changes. Torch
gives ``p.data`` a counter of its own, so ``net.layer("conv1").weight.data.copy_(w)``, a
common idiom for net surgery and weight init, bumped nothing, and the next inference ran the
old packed weights (CaffeNet, conv2: fc8 off by 91). Every learnable param blob is a
``CaffeParameter``: reading or setting its ``.data`` counts a touch, and a cache whose count
differs computes again (``touches``). A read that writes nothing costs one recomputation at the
next call.

Not seen: a tensor taken from ``.data`` and written after a later forward; writes through a
numpy view (``.detach().numpy()``); and ``.data`` of a blob kept as a buffer (BatchNorm's
statistics), which needs no ``.data`` (it requires no grad: ``bn.mean.copy_(m)`` bumps its
version). A Tensor subclass for those buffers would reach torch.compile's graphs, whose
custom ops (``opaque_conv``) refuse one. ``TorchNet.params_changed`` is for these.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

_TENSOR_DATA = torch._C.TensorBase.__dict__["data"]  # torch's own getter and setter
_PARAMETER_NEW = nn.Parameter.__new__.__code__  # where ``detach`` keeps the type (below)
touches = 0  # how many times a CaffeParameter's ``.data`` was read or set, ever


def _touched() -> None:
    global touches
    touches += 1


class CaffeParameter(nn.Parameter):
    """An ``nn.Parameter`` (a param blob of a Caffe layer) whose ``.data`` counts a touch.

    It pickles as ``nn.Parameter`` does, to a plain one (so ``torch.load(weights_only=True)``
    reads a ``state_dict(keep_vars=True)``); a layer unpickled watches its params again."""

    @property  # type: ignore[override]
    def data(self) -> torch.Tensor:
        _touched()
        return _TENSOR_DATA.__get__(self)

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        _touched()
        _TENSOR_DATA.__set__(self, value)

    def detach(self) -> torch.Tensor:  # type: ignore[override]
        """Torch's, but in ``nn.Parameter(p)``: torch makes a Parameter from a subclass as
        that subclass's ``detach()`` and refuses another type, so there (and only there) the
        detached tensor is a CaffeParameter, the new param (watched too). ``parametrize``'s
        weight_norm and weight tying (``layer.weight = nn.Parameter(other.weight)``) do it."""
        out = torch.Tensor.detach(self)
        if not torch.compiler.is_compiling() and sys._getframe(1).f_code is _PARAMETER_NEW:
            out.__class__ = CaffeParameter
        return out

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
        """As an ``nn.Parameter`` prints (torch would name the subclass inside it)."""
        return repr(nn.Parameter(self.detach(), self.requires_grad))


def watch(module: nn.Module) -> None:
    """Make ``module``'s own plain ``nn.Parameter``s CaffeParameters, where a copy or a move
    made them plain, in place (the same objects: params shared with other layers stay
    shared)."""
    for param in module._parameters.values():
        if type(param) is nn.Parameter:
            param.__class__ = CaffeParameter
