"""RNN: Caffe's vanilla (Elman) recurrent layer with a tanh output layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import register_layer
from .recurrent import RecurrentLayer


@register_layer("RNN")
class RNNLayer(RecurrentLayer):
    """o_t from x_t and h_{t-1}. Caffe type ``RNN``, ``recurrent_param``.

    h_t = tanh(W_hh (cont_t * h_{t-1}) + W_xh x_t + b_h [+ W_xh_static x_static]),
    o_t = tanh(W_ho h_t + b_o). Top: o (T, N, H); with expose_hidden bottom h0, top hT.
    Param blobs (unrolled-net order): W_xh (H, I), b_h (H,), [W_xh_static (H, S)],
    W_hh (H, H), W_ho (H, H), b_o (H,).
    Differs from torch: nn.RNN has no output layer, no cont resets and two hidden biases.
    """

    state_names = ("h",)

    # param blobs, registered by add_blob
    w_xh: torch.Tensor
    b_h: torch.Tensor
    w_xh_static: torch.Tensor
    w_hh: torch.Tensor
    w_ho: torch.Tensor
    b_o: torch.Tensor

    def add_params(self, p) -> None:
        h = self.num_output
        self.add_blob("w_xh", (h, self.input_dim), filler=p.weight_filler)
        self.add_blob("b_h", (h,), filler=p.bias_filler)
        if self.static_input:
            self.add_blob("w_xh_static", (h, self.static_dim), filler=p.weight_filler)
        self.add_blob("w_hh", (h, h), filler=p.weight_filler)
        self.add_blob("w_ho", (h, h), filler=p.weight_filler)
        self.add_blob("b_o", (h,), filler=p.bias_filler)

    def unroll(self, x, cont, x_static, state):
        x_in = F.linear(x, self.w_xh, self.b_h)
        static_in = F.linear(x_static, self.w_xh_static) if self.static_input else None
        h = state[0][0]
        hs = []
        for t in range(x.shape[0]):
            pre = F.linear(cont[t].unsqueeze(-1) * h, self.w_hh) + x_in[t]
            if static_in is not None:
                pre = pre + static_in
            h = torch.tanh(pre)
            hs.append(h)
        hidden = torch.stack(hs) if hs else x_in.new_zeros(0, x.shape[1], self.num_output)
        return torch.tanh(F.linear(hidden, self.w_ho, self.b_o)), [h.unsqueeze(0)]
