"""LSTMUnit: one LSTM time step on precomputed gate inputs (the LSTM layer's inner step)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import register_layer
from ._functional.lstm_unit import lstm_unit_step
from .base import CaffeLayer, Exactly, Shape


@register_layer("LSTMUnit")
class LSTMUnitLayer(CaffeLayer):
    """(c_prev, x, cont) -> (c, h). Caffe type ``LSTMUnit``, no params message.

    Bottoms: c_prev (1, N, H), x (1, N, 4H) gate pre-activations in order i, f, o, g,
    cont (1, N). i, o = sigmoid, g = tanh, f = cont * sigmoid(x_f) (exactly 0 where cont is 0);
    c = f * c_prev + i * g, h = o * tanh(c); both tops (1, N, H). cont gets no gradient.
    Differs from torch: the forget-gate gradient is Caffe's f * (1 - f), which differs from
    the exact one when cont is neither 0 nor 1 (see _functional/lstm_unit.py).
    """

    bottoms = Exactly(3)
    tops = Exactly(2)
    no_force_backward = frozenset({2})
    refused_bottoms = frozenset({2})  # CHECK: "Cannot backpropagate to sequence indicators."
    # Caffe's Backward returns only when neither c_prev nor x wants a diff, else writes both
    always_diffed_bottoms = frozenset({0, 1})

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self._check_shapes(self.bottom_shapes)

    def _check_shapes(self, shapes: Sequence[Shape]) -> None:
        """Caffe's Reshape: c_prev and x 3-D, cont 2-D, all (1, N, ...), x has 4H channels."""
        n = shapes[0][1] if len(shapes[0]) > 1 else None
        for i, (shape, axes, what) in enumerate(zip(shapes, (3, 3, 2), ("c_prev", "x", "cont"))):
            if len(shape) != axes:
                raise self.error(
                    f"{what} (bottom[{i}]) must have {axes} axes",
                    expected=f"{axes} axes",
                    got=tuple(shape),
                )
            if shape[0] != 1 or shape[1] != n:
                raise self.error(
                    f"{what} (bottom[{i}]) must be (1, #streams, ...)",
                    expected=f"(1, {n}, ...)",
                    got=tuple(shape),
                )
        if shapes[1][2] != 4 * shapes[0][2]:
            raise self.error(
                "x (bottom[1]) must hold 4 gate inputs per hidden unit",
                expected=4 * shapes[0][2],
                got=shapes[1][2],
            )

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        self._check_shapes(bottom_shapes)
        shape = tuple(int(d) for d in bottom_shapes[0])
        return [shape, shape]

    def forward(self, c_prev: torch.Tensor, x: torch.Tensor, cont: torch.Tensor):
        self._check_shapes([tuple(c_prev.shape), tuple(x.shape), tuple(cont.shape)])
        return lstm_unit_step(c_prev, x, cont.to(x.dtype))
