"""RNN: h_t = tanh(W_hh (cont h) + W_xh x + b_h), o_t = tanh(W_ho h_t + b_o), blob order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError, LayerParamError

FILLERS = (
    "weight_filler { type: 'uniform' min: -0.6 max: 0.6 } "
    "bias_filler { type: 'uniform' min: -0.6 max: 0.6 }"
)


def _bottoms(x_shape, static_shape=None, hidden=0, hidden_dim=4):
    """x normal, cont 0 at t = 0 and at a mid-sequence restart, else 1."""

    def make(gen):
        t, n = x_shape[:2]
        cont = torch.ones(t, n)
        cont[0] = 0
        cont[t // 2, -1] = 0
        out = [torch.randn(x_shape, generator=gen), cont]
        if static_shape:
            out.append(torch.randn(static_shape, generator=gen))
        out += [torch.randn(1, n, hidden_dim, generator=gen) for _ in range(hidden)]
        return out

    return make


CASES = [
    LayerCase(
        "RNN",
        f"recurrent_param {{ num_output: 4 {FILLERS} }}",
        ((5, 3, 2), (5, 3)),
        make_bottoms=_bottoms((5, 3, 2)),
        id="rnn_basic",
    ),
    LayerCase(
        "RNN",
        f"recurrent_param {{ num_output: 4 {FILLERS} }}",
        ((3, 2, 5), (3, 2), (2, 3, 2)),
        make_bottoms=_bottoms((3, 2, 5), (2, 3, 2)),
        id="rnn_static",
    ),
    LayerCase(
        "RNN",
        f"recurrent_param {{ num_output: 4 expose_hidden: true {FILLERS} }}",
        ((3, 2, 3), (3, 2), (1, 2, 4)),
        n_tops=2,
        make_bottoms=_bottoms((3, 2, 3), hidden=1),
        id="rnn_expose",
    ),
]


def ref_rnn(x, cont, params, x_static=None, h0=None):
    """Caffe's unrolled RNN net, stated with numpy."""
    w_xh, b_h = params[0], params[1]
    w_hh, w_ho, b_o = params[-3:]
    t_len, n = cont.shape
    x = x.reshape(t_len, n, -1)
    h = np.zeros((n, w_hh.shape[0])) if h0 is None else h0[0]
    outs = []
    for t in range(t_len):
        pre = (cont[t][:, None] * h) @ w_hh.T + x[t] @ w_xh.T + b_h
        if x_static is not None:
            pre = pre + x_static.reshape(n, -1) @ params[2].T
        h = np.tanh(pre)
        outs.append(np.tanh(h @ w_ho.T + b_o))
    return np.stack(outs), h[None]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_matches_reference(case):
    layer, bottoms = case.build()
    layer = layer.double()
    b = [t.double() for t in bottoms]
    with torch.no_grad():
        out = layer(*b)
    out = out if isinstance(out, tuple) else (out,)
    arrays = [t.numpy() for t in b]
    params = [p.detach().numpy() for p in layer.param_blobs()]
    if layer.expose_hidden:
        want = ref_rnn(arrays[0], arrays[1], params, h0=arrays[2])
    else:
        want = ref_rnn(arrays[0], arrays[1], params, arrays[2] if layer.static_input else None)
    for got, w in zip(out, want):
        np.testing.assert_allclose(got.numpy(), w, rtol=1e-12, atol=1e-12)


def test_param_blob_shapes_in_caffe_order():
    layer, _ = CASES[1].build()
    assert [tuple(p.shape) for p in layer.param_blobs()] == [
        (4, 5),
        (4,),
        (4, 6),
        (4, 4),
        (4, 4),
        (4,),
    ]
    assert layer.output_shapes([(3, 2, 5), (3, 2), (2, 3, 2)]) == [(3, 2, 4)]
    expose, _ = CASES[2].build()
    assert expose.output_shapes([(3, 2, 3), (3, 2), (1, 2, 4)]) == [(3, 2, 4), (1, 2, 4)]


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[i for i in range(len(bottoms)) if i != 1])


def test_gradient_expose_hidden_output_top():
    layer, bottoms = CASES[2].build()
    for k in (0, 9, 23):
        check_layer_gradient(layer, bottoms, top_index=(0, k), bottom_indices=[0])


def test_expose_hidden_initial_state_used_without_gradient():
    layer, bottoms = CASES[2].build()
    x, cont, h0 = [b.clone().requires_grad_(i != 1) for i, b in enumerate(bottoms)]
    cont.fill_(1)
    o, h_t = layer(x, cont, h0)
    assert not h_t.requires_grad
    o.sum().backward()
    assert h0.grad is None and x.grad is not None
    with torch.no_grad():
        assert not torch.allclose(layer(x, cont, torch.zeros_like(h0))[0], o)
        cont[0] = 0  # a restart at t = 0 ignores h0
        torch.testing.assert_close(layer(x, cont, h0)[0], layer(x, cont, 5 * h0)[0])


def test_state_carries_across_forwards():
    layer, bottoms = CASES[0].build()
    x, cont = bottoms
    cont = torch.ones_like(cont)
    with torch.no_grad():
        first = layer(x, cont)
        second = layer(x, cont)  # starts from the first call's h_T
        layer.reset()
        again = layer(x, cont)
    torch.testing.assert_close(again, first)
    assert not torch.allclose(second, first)


@pytest.mark.parametrize(
    "snippet, shapes, match",
    [
        ("recurrent_param { num_output: 0 }", [(3, 2, 4), (3, 2)], r"num_output must be positive"),
        ("recurrent_param { num_output: 2 }", [(3, 2, 4), (2, 2)], r"cont \(bottom\[1\]\)"),
        (
            "recurrent_param { num_output: 2 expose_hidden: true }",
            [(3, 2, 4), (3, 2), (2, 2, 2)],
            r"initial state h0",
        ),
    ],
)
def test_bad_params_raise(snippet, shapes, match):
    n_tops = 2 if "expose" in snippet else 1
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(RNN\).*" + match):
        make_layer(snippet, shapes, type="RNN", n_tops=n_tops)


def test_wrong_blob_counts_raise():
    with pytest.raises(BlobWiringError, match=r"2 to 3 bottom\(s\)"):
        make_layer("recurrent_param { num_output: 2 }", [(3, 2, 4)], type="RNN")
    with pytest.raises(BlobWiringError, match=r"exactly 2 top\(s\) \(output, hT\)"):
        make_layer(
            "recurrent_param { num_output: 2 expose_hidden: true }",
            [(3, 2, 4), (3, 2), (1, 2, 2)],
            type="RNN",
        )
