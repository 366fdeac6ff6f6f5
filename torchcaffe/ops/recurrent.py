"""Shared base of Caffe's recurrent layers (RNN, LSTM): shapes, cont, static input, state.

Caffe unrolls these layers into an internal net; here the recurrence runs directly on torch
ops. What the base reproduces from recurrent_layer.cpp:
- bottoms: x (T, N, D...), cont (T, N), optional x_static (N, S...), then with ``expose_hidden``
  the initial states (1, N, H) in the order of ``state_names``; tops: the output sequence,
  then with ``expose_hidden`` the final states (1, N, H).
- cont[t] multiplies the state carried into step t (0 restarts a sequence); cont gets no
  gradient.
- Without ``expose_hidden`` the initial state is the final state of the previous forward
  (zeros at first), held in non-persistent buffers; ``reset()`` zeroes it (Caffe's Reset).
  No gradient crosses forward calls.
- With ``expose_hidden`` the initial-state bottoms get no gradient and the diffs of the
  final-state tops are ignored (Caffe shares their data only, never their diffs).
"""

from __future__ import annotations

import abc
import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import ClassVar

import torch

from ..errors import BlobWiringError, TracedStateWarning
from ._exporting import exporting
from .base import Between, CaffeLayer, Shape

# Caffe's own check asks for 2 axes, but its unrolled net's input InnerProduct (axis 2) then
# fails on a 2-D x; say so up front.
_X_AXES = (
    "bottom[0] must have at least 3 axes (#timesteps, #streams, features...): its "
    "transform is an InnerProduct over axis 2"
)


class RecurrentLayer(CaffeLayer, metaclass=abc.ABCMeta):
    """Base of RNN and LSTM (``recurrent_param``: num_output, weight_filler, bias_filler,
    debug_info, expose_hidden). Subclasses name their states, create their param blobs in
    Caffe's unrolled-net order in ``add_params`` and run the time loop in ``unroll``."""

    param_field = "recurrent_param"
    bottoms = Between(2, 5)  # the exact count depends on expose_hidden: see check_arity
    tops = Between(1, 3)
    no_force_backward = frozenset({1})
    refused_bottoms = frozenset({1})  # CHECK: "Cannot backpropagate to sequence indicators."
    state_names: ClassVar[tuple[str, ...]] = ()
    restrictions = (
        "debug_info is accepted and ignored; when N changes between forwards the "
        "carried state restarts from zeros (Caffe reuses stale memory)"
    )

    @classmethod
    def check_arity(cls, layer_param) -> None:
        expose = layer_param.recurrent_param.expose_hidden
        n_state = len(cls.state_names) if expose else 0
        states = "".join(f", {s}0" for s in cls.state_names) if expose else ""
        nb, nt = len(layer_param.bottom), len(layer_param.top)
        low = 2 + n_state
        if not low <= nb <= low + 1:
            raise BlobWiringError(
                "wrong number of bottom blobs",
                layer=layer_param.name,
                layer_type=layer_param.type,
                expected=f"{low} to {low + 1} bottom(s) (x, cont, [x_static]{states})",
                got=nb,
            )
        if nt != 1 + n_state:
            finals = "".join(f", {s}T" for s in cls.state_names) if expose else ""
            raise BlobWiringError(
                "wrong number of top blobs",
                layer=layer_param.name,
                layer_type=layer_param.type,
                expected=f"exactly {1 + n_state} top(s) (output{finals})",
                got=nt,
            )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        if p.num_output <= 0:
            raise self.error("num_output must be positive", expected="> 0", got=p.num_output)
        self.num_output = int(p.num_output)
        self.expose_hidden = bool(p.expose_hidden)
        n_state = len(self.state_names) if self.expose_hidden else 0
        shapes = self.bottom_shapes
        self.static_input = len(shapes) > 2 + n_state
        # the unrolled net's transforms of x and x_static say propagate_down: true, so Caffe's
        # Backward writes those diffs whenever it runs (x_input_blob_ shares bottom[0]'s diff)
        self.always_diffed_bottoms = frozenset({0, 2} if self.static_input else {0})
        if len(shapes[0]) < 3:
            raise self.error(_X_AXES, expected=">= 3 axes", got=shapes[0])
        self.T, n = shapes[0][0], shapes[0][1]
        self._check_shapes(shapes)
        self.input_dim = math.prod(shapes[0][2:])
        self.static_dim = math.prod(shapes[2][1:]) if self.static_input else 0
        self.add_params(p)
        if not self.expose_hidden:
            for name in self.state_names:
                self.register_buffer(
                    f"{name}_state", torch.zeros(1, n, self.num_output), persistent=False
                )

    def _check_shapes(self, shapes: Sequence[Shape]) -> None:
        """Caffe's Reshape checks: T fixed at setup, cont (T, N), x_static (N, ...), states."""
        x, cont = tuple(shapes[0]), tuple(shapes[1])
        if len(x) < 3:
            raise self.error(_X_AXES, expected=">= 3 axes", got=x)
        if x[0] != self.T:
            raise self.error("input number of timesteps changed", expected=self.T, got=x[0])
        if cont != x[:2]:
            raise self.error(
                "cont (bottom[1]) must be (#timesteps, #streams)", expected=x[:2], got=cont
            )
        if self.static_input:
            static = tuple(shapes[2])
            if len(static) < 2 or static[0] != x[1]:
                raise self.error(
                    "x_static (bottom[2]) must be (#streams, features...): its "
                    "transform is an InnerProduct over axis 1",
                    expected=f"({x[1]}, ...) with >= 2 axes",
                    got=static,
                )
        if self.expose_hidden:
            want = (1, x[1], self.num_output)
            for k, name in enumerate(self.state_names):
                i = 2 + self.static_input + k
                if tuple(shapes[i]) != want:
                    raise self.error(
                        f"initial state {name}0 (bottom[{i}]) has the wrong shape",
                        expected=want,
                        got=tuple(shapes[i]),
                    )

    # -- subclass hooks -------------------------------------------------------------------
    @abc.abstractmethod
    def add_params(self, p) -> None:
        """Create this cell's weight blobs from the recurrent param ``p``."""

    @abc.abstractmethod
    def unroll(
        self,
        x: torch.Tensor,
        cont: torch.Tensor,
        x_static: torch.Tensor | None,
        state: list[torch.Tensor],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """x (T, N, I), cont (T, N), x_static (N, S) -> (output sequence, final states)."""

    # -- the recurrence -------------------------------------------------------------------
    @property
    def carries_state(self) -> bool:
        """Each forward starts from the state the previous one left (no ``expose_hidden``):
        running it again is not a replay of the same forward."""
        return not self.expose_hidden

    @contextlib.contextmanager
    def state_kept(self) -> Iterator[None]:
        """Forwards inside leave the carried state as it was (a replay for a backward that
        had no forward: Caffe's Backward never moves the state)."""
        names = self.state_names if self.carries_state else ()
        held = [getattr(self, f"{name}_state") for name in names]
        try:
            yield
        finally:
            for name, state in zip(names, held):
                setattr(self, f"{name}_state", state)

    def _traced_state_message(self) -> str:
        return (
            f"layer '{self.name}' ({self.caffe_type}) carries its hidden state from one forward "
            "to the next, which a traced or exported graph cannot: each call of the graph "
            "starts from the state held now (zeros after reset()), where Caffe's net goes on "
            "from the last forward's wherever cont is 1. Set recurrent_param { expose_hidden: "
            "true } to pass the state in and out"
        )

    def reset(self) -> None:
        """Zero the carried state (Caffe's RecurrentLayer::Reset)."""
        for name in self.state_names if not self.expose_hidden else ():
            getattr(self, f"{name}_state").zero_()

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        self._check_shapes(bottom_shapes)
        t, n = bottom_shapes[0][:2]
        states: list[Shape] = [(1, n, self.num_output)] * (
            len(self.state_names) if self.expose_hidden else 0
        )
        return [(t, n, self.num_output), *states]

    def forward(self, x: torch.Tensor, cont: torch.Tensor, *rest: torch.Tensor):
        self._check_shapes([tuple(x.shape), tuple(cont.shape)] + [tuple(r.shape) for r in rest])
        t, n = x.shape[:2]
        x_static = rest[0].reshape(n, -1) if self.static_input else None
        if self.expose_hidden:
            state = [h.detach() for h in rest[self.static_input :]]
        else:
            if torch.jit.is_tracing() or exporting():
                warnings.warn(self._traced_state_message(), TracedStateWarning, stacklevel=2)
            state = []
            for name in self.state_names:
                held = getattr(self, f"{name}_state")
                if tuple(held.shape) != (1, n, self.num_output):
                    held = torch.zeros(1, n, self.num_output)
                state.append(held.detach().to(device=x.device, dtype=x.dtype))
        out, final = self.unroll(x.reshape(t, n, -1), cont.detach().to(x.dtype), x_static, state)
        if self.expose_hidden:
            return (out, *(s.detach() for s in final))
        if x.device.type != "meta":
            # a normal tensor even under inference_mode: a later autograd forward saves it
            # for backward, and reset() zeroes it in place
            with torch.inference_mode(False):
                for name, s in zip(self.state_names, final):
                    setattr(self, f"{name}_state", s.detach().clone())
        return out
