"""LSTM: gate order i, f, o, g, cont resets, static input, expose_hidden, carried state."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError, LayerParamError, TracedStateWarning

FILLERS = (
    "weight_filler { type: 'uniform' min: -0.5 max: 0.5 } "
    "bias_filler { type: 'uniform' min: -0.5 max: 0.5 }"
)


def _bottoms(x_shape, static_shape=None, hidden=0, hidden_dim=3):
    """x normal, cont 0 at t = 0 and at a mid-sequence restart, else 1."""

    def make(gen):
        t, n = x_shape[:2]
        cont = torch.ones(t, n)
        cont[0] = 0
        cont[t // 2, 0] = 0
        out = [torch.randn(x_shape, generator=gen), cont]
        if static_shape:
            out.append(torch.randn(static_shape, generator=gen))
        out += [torch.randn(1, n, hidden_dim, generator=gen) for _ in range(hidden)]
        return out

    return make


CASES = [
    LayerCase(
        "LSTM",
        f"recurrent_param {{ num_output: 3 {FILLERS} }}",
        ((4, 2, 5), (4, 2)),
        make_bottoms=_bottoms((4, 2, 5)),
        id="lstm_basic",
    ),
    LayerCase(
        "LSTM",
        f"recurrent_param {{ num_output: 3 {FILLERS} }}",
        ((3, 2, 4), (3, 2), (2, 5)),
        make_bottoms=_bottoms((3, 2, 4), (2, 5)),
        id="lstm_static",
    ),
    LayerCase(
        "LSTM",
        f"recurrent_param {{ num_output: 3 expose_hidden: true {FILLERS} }}",
        ((3, 2, 2, 3), (3, 2), (1, 2, 3), (1, 2, 3)),
        n_tops=3,
        make_bottoms=_bottoms((3, 2, 2, 3), hidden=2),
        id="lstm_expose_4d",
    ),
]


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def ref_lstm(x, cont, params, x_static=None, h0=None, c0=None):
    """Caffe's unrolled net: gates = W_xc x_t + b_c [+ W_xc_static xs] + W_hc (cont_t h)."""
    w_xc, b_c = params[0], params[1]
    w_hc = params[-1]
    t_len, n = cont.shape
    hdim = w_hc.shape[1]
    x = x.reshape(t_len, n, -1)
    h = np.zeros((n, hdim)) if h0 is None else h0[0]
    c = np.zeros((n, hdim)) if c0 is None else c0[0]
    hs = []
    for t in range(t_len):
        k = cont[t][:, None]
        gates = w_hc @ (k * h).T + (x[t] @ w_xc.T + b_c).T
        if x_static is not None:
            gates = gates + params[2] @ x_static.reshape(n, -1).T
        i, f, o = (sigmoid(gates[j * hdim : (j + 1) * hdim].T) for j in range(3))
        g = np.tanh(gates[3 * hdim :].T)
        c = k * f * c + i * g
        h = o * np.tanh(c)
        hs.append(h)
    return np.stack(hs), h[None], c[None]


def _numpy(layer):
    return [p.detach().numpy() for p in layer.param_blobs()]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_matches_reference(case):
    layer, bottoms = case.build()
    layer = layer.double()
    b = [t.double() for t in bottoms]
    with torch.no_grad():
        out = layer(*b)
    out = out if isinstance(out, tuple) else (out,)
    arrays = [t.numpy() for t in b]
    static = arrays[2] if len(arrays) == 3 else None
    hidden = arrays[2:] if len(arrays) == 4 else (None, None)
    want = ref_lstm(arrays[0], arrays[1], _numpy(layer), static, *hidden)
    for got, w in zip(out, want):
        np.testing.assert_allclose(got.numpy(), w, rtol=1e-12, atol=1e-12)


def test_param_blob_shapes_in_caffe_order():
    layer, _ = CASES[1].build()
    assert [tuple(p.shape) for p in layer.param_blobs()] == [(12, 4), (12,), (12, 5), (12, 3)]
    assert layer.output_shapes([(3, 2, 4), (3, 2), (2, 5)]) == [(3, 2, 3)]


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[i for i in range(len(bottoms)) if i != 1])


def test_gradient_expose_hidden_output_top():
    layer, bottoms = CASES[2].build()
    for k in (0, 7, 17):
        check_layer_gradient(layer, bottoms, top_index=(0, k), bottom_indices=[0])


def test_expose_hidden_no_gradient_to_initial_state_or_from_final_state():
    layer, bottoms = CASES[2].build()
    x, cont, h0, c0 = [b.clone().requires_grad_(i != 1) for i, b in enumerate(bottoms)]
    cont.fill_(1)
    h, h_t, c_t = layer(x, cont, h0, c0)
    assert not h_t.requires_grad and not c_t.requires_grad
    torch.testing.assert_close(h_t[0], h[-1])
    h.sum().backward()
    assert h0.grad is None and c0.grad is None and x.grad is not None
    with torch.no_grad():  # the initial state is used where cont is 1
        assert not torch.allclose(layer(x, cont, torch.zeros_like(h0), c0)[0], h)


def test_state_carries_across_forwards_and_reset():
    layer, _ = make_layer(
        f"recurrent_param {{ num_output: 3 {FILLERS} }}",
        [(6, 2, 4), (6, 2)],
        type="LSTM",
        dtype=torch.float64,
    )
    x = torch.randn(6, 2, 4, dtype=torch.float64)
    cont = torch.ones(6, 2, dtype=torch.float64)
    cont[0] = 0
    with torch.no_grad():
        whole = layer(x, cont)
        layer.reset()
        half, _ = make_layer(
            f"recurrent_param {{ num_output: 3 {FILLERS} }}",
            [(3, 2, 4), (3, 2)],
            type="LSTM",
            dtype=torch.float64,
        )
        half.load_state_dict(layer.state_dict())
        first = half(x[:3], cont[:3])
        second = half(x[3:], cont[3:])  # cont 1 at its t = 0: continues from the first call
        torch.testing.assert_close(torch.cat([first, second]), whole)
        half.reset()
        restarted = half(x[3:], cont[3:])
    assert not torch.allclose(restarted, second)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_state_carried_out_of_inference_mode_serves_autograd_and_reset(kind):
    """An evaluation under inference_mode, then a training forward from its state."""
    layer, _ = make_layer(
        f"recurrent_param {{ num_output: 3 {FILLERS} }}", [(2, 2, 4), (2, 2)], type=kind
    )
    x, cont = torch.randn(2, 2, 4), torch.ones(2, 2)
    with torch.inference_mode():
        layer(x, cont)
    x.requires_grad_(True)
    layer(x, cont).sum().backward()
    assert x.grad is not None and bool(x.grad.any())
    with torch.inference_mode():
        layer(x.detach(), cont)
    layer.reset()
    assert not any(bool(b.any()) for b in layer.buffers())


def test_non_binary_cont_scales_carried_state():
    layer, bottoms = CASES[0].build()
    layer = layer.double()
    x, cont = bottoms[0].double(), bottoms[1].double()
    cont[1:] = 0.5
    with torch.no_grad():
        got = layer(x, cont).numpy()
    want = ref_lstm(x.numpy(), cont.numpy(), _numpy(layer))[0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "snippet, shapes, match",
    [
        ("recurrent_param { }", [(3, 2, 4), (3, 2)], r"num_output must be positive"),
        ("recurrent_param { num_output: 2 }", [(3, 2, 4), (3, 3)], r"cont \(bottom\[1\]\)"),
        ("recurrent_param { num_output: 2 }", [(3,), (3, 2)], r"at least 3 axes"),
        ("recurrent_param { num_output: 2 }", [(3, 2), (3, 2)], r"at least 3 axes"),
        ("recurrent_param { num_output: 2 }", [(3, 2, 4), (3, 2), (4, 5)], r"x_static"),
        ("recurrent_param { num_output: 2 }", [(3, 2, 4), (3, 2), (2,)], r"x_static"),
        (
            "recurrent_param { num_output: 2 expose_hidden: true }",
            [(3, 2, 4), (3, 2), (1, 2, 3), (1, 2, 2)],
            r"initial state h0",
        ),
    ],
)
def test_bad_params_raise(snippet, shapes, match):
    n_tops = 3 if "expose" in snippet else 1
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(LSTM\).*" + match):
        make_layer(snippet, shapes, type="LSTM", n_tops=n_tops)


def test_wrong_blob_counts_raise():
    with pytest.raises(BlobWiringError, match=r"4 to 5 bottom\(s\) \(x, cont, \[x_static\], h0"):
        make_layer(
            "recurrent_param { num_output: 2 expose_hidden: true }",
            [(3, 2, 4), (3, 2)],
            type="LSTM",
            n_tops=3,
        )
    with pytest.raises(BlobWiringError, match=r"exactly 1 top"):
        make_layer("recurrent_param { num_output: 2 }", [(3, 2, 4), (3, 2)], type="LSTM", n_tops=2)


def test_forward_rejects_changed_timesteps():
    layer, _ = CASES[0].build()
    with pytest.raises(LayerParamError, match="timesteps changed"):
        layer(torch.randn(5, 2, 5), torch.ones(5, 2))


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
@pytest.mark.parametrize("how", ["jit.trace", "torch.export"])
def test_tracing_a_carried_state_warns_that_the_graph_cannot_carry_it(kind, how):
    """A trace or an export keeps the state held when it was made: called with cont 1 at
    t = 0, the graph's second call gave what the layer's first did, where the layer went on
    from its state. An exposed state (inputs and tops) is traced as it is, without a word."""
    for expose in (False, True):
        hidden = 1 if kind == "RNN" else 2
        layer, _ = make_layer(
            f"recurrent_param {{ num_output: 3 {'expose_hidden: true' if expose else ''} "
            f"{FILLERS} }}",
            [(3, 2, 4), (3, 2)] + [(1, 2, 3)] * (hidden if expose else 0),
            type=kind,
            n_tops=1 + (hidden if expose else 0),
        )
        bottoms = _bottoms((3, 2, 4), hidden=hidden if expose else 0)(torch.Generator())
        bottoms[1] = torch.ones(3, 2)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if how == "jit.trace":
                torch.jit.trace(layer, tuple(bottoms), strict=False, check_trace=False)
            else:
                torch.export.export(layer, tuple(bottoms))
        told = [w for w in seen if issubclass(w.category, TracedStateWarning)]
        if expose:
            assert not told
        else:
            assert len(told) == 1 and "expose_hidden: true" in str(told[0].message)
