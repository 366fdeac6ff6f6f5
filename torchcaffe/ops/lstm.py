"""LSTM: Caffe's long short-term memory over a (T, N, ...) sequence, no peepholes."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import register_layer
from ._functional.lstm_unit import lstm_unit_step
from .recurrent import RecurrentLayer


@register_layer("LSTM")
class LSTMLayer(RecurrentLayer):
    """h_t, c_t from x_t, h_{t-1}, c_{t-1}. Caffe type ``LSTM``, ``recurrent_param``.

    gates_t = W_xc x_t + b_c [+ W_xc_static x_static] + W_hc (cont_t * h_{t-1}), rows in gate
    order i, f, o, g (H each); then the LSTMUnit step: c_t = cont_t * f * c_{t-1} + i * g,
    h_t = o * tanh(c_t). Top: h (T, N, H); with expose_hidden bottoms h0, c0 and tops hT, cT.
    Param blobs (unrolled-net order): W_xc (4H, I), b_c (4H,), [W_xc_static (4H, S)],
    W_hc (4H, H), where I and S are the trailing sizes of x and x_static flattened.
    Differs from torch: nn.LSTM orders gates i, f, g, o and has two biases; Caffe's forget
    gate gradient uses f * (1 - f) with f = cont * sigmoid (see _functional/lstm_unit.py).
    """

    state_names = ("h", "c")

    # param blobs, registered by add_blob
    w_xc: torch.Tensor
    b_c: torch.Tensor
    w_xc_static: torch.Tensor
    w_hc: torch.Tensor

    def add_params(self, p) -> None:
        gates = 4 * self.num_output
        self.add_blob("w_xc", (gates, self.input_dim), filler=p.weight_filler)
        self.add_blob("b_c", (gates,), filler=p.bias_filler)
        if self.static_input:
            self.add_blob("w_xc_static", (gates, self.static_dim), filler=p.weight_filler)
        self.add_blob("w_hc", (gates, self.num_output), filler=p.weight_filler)

    def unroll(self, x, cont, x_static, state):
        x_gates = F.linear(x, self.w_xc, self.b_c)
        static_gates = F.linear(x_static, self.w_xc_static) if self.static_input else None
        h, c = state[0][0], state[1][0]
        hs = []
        for t in range(x.shape[0]):
            gates = F.linear(cont[t].unsqueeze(-1) * h, self.w_hc) + x_gates[t]
            if static_gates is not None:
                gates = gates + static_gates
            c, h = lstm_unit_step(c, gates, cont[t])
            hs.append(h)
        out = torch.stack(hs) if hs else x_gates.new_zeros(0, x.shape[1], self.num_output)
        return out, [h.unsqueeze(0), c.unsqueeze(0)]
