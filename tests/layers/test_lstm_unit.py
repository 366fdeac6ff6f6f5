"""LSTMUnit: gate order i, f, o, g, cont masking of the forget gate, Caffe's backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError


def _bottoms(n, h, cont=(0.0, 1.0, 1.0)):
    def make(gen):
        return [
            torch.randn(1, n, h, generator=gen),
            torch.randn(1, n, 4 * h, generator=gen),
            torch.tensor([list(cont)]),
        ]

    return make


CASES = [
    LayerCase(
        "LSTMUnit",
        "",
        ((1, 3, 4), (1, 3, 16), (1, 3)),
        n_tops=2,
        make_bottoms=_bottoms(3, 4),
        id="lstm_unit",
    ),
    LayerCase(
        "LSTMUnit",
        "",
        ((1, 2, 5), (1, 2, 20), (1, 2)),
        n_tops=2,
        make_bottoms=_bottoms(2, 5, (1.0, 1.0)),
        id="lstm_unit_cont1",
    ),
]


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def ref_lstm_unit(c_prev, x, cont, c_diff, h_diff):
    """Caffe's loops: -> (c, h, c_prev diff, x diff); f = 0 where cont == 0."""
    hdim = c_prev.shape[-1]
    k = cont[..., None]
    i, f, o = (sigmoid(x[..., j * hdim : (j + 1) * hdim]) for j in range(3))
    f = np.where(k == 0, 0.0, k * f)
    g = np.tanh(x[..., 3 * hdim :])
    c = f * c_prev + i * g
    h = o * np.tanh(c)
    term = c_diff + h_diff * o * (1 - np.tanh(c) ** 2)
    x_diff = np.concatenate(
        [
            term * g * i * (1 - i),
            term * c_prev * f * (1 - f),
            h_diff * np.tanh(c) * o * (1 - o),
            term * i * (1 - g * g),
        ],
        -1,
    )
    return c, h, term * f, x_diff


@pytest.mark.parametrize("cont", [(0.0, 1.0, 1.0), (0.5, 0.0, 2.0)])
def test_forward_backward_match_caffe(cont):
    """Non-binary cont: Caffe's forget-gate diff uses f (1 - f) with f = cont * sigmoid."""
    layer, bottoms = make_layer(
        "",
        [(1, 3, 4), (1, 3, 16), (1, 3)],
        type="LSTMUnit",
        n_tops=2,
        bottoms=_bottoms(3, 4, cont)(torch.Generator().manual_seed(3)),
        dtype=torch.float64,
    )
    c_prev, x, k = [b.double().requires_grad_(i != 2) for i, b in enumerate(bottoms)]
    c, h = layer(c_prev, x, k)
    rng = np.random.default_rng(0)
    c_diff, h_diff = rng.standard_normal((2, 1, 3, 4))
    torch.autograd.backward([c, h], [torch.tensor(c_diff), torch.tensor(h_diff)])
    want = ref_lstm_unit(c_prev.detach().numpy(), x.detach().numpy(), k.numpy(), c_diff, h_diff)
    for got, w in zip((c, h, c_prev.grad, x.grad), want):
        np.testing.assert_allclose(got.detach().numpy(), w, rtol=1e-12, atol=1e-14)
    assert k.grad is None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0, 1])


def test_output_shapes():
    layer, _ = CASES[0].build()
    assert layer.output_shapes([(1, 3, 4), (1, 3, 16), (1, 3)]) == [(1, 3, 4), (1, 3, 4)]


@pytest.mark.parametrize(
    "shapes, match",
    [
        ([(1, 3, 4), (1, 3, 12), (1, 3)], r"4 gate inputs per hidden unit; expected 16, got 12"),
        ([(1, 3, 4), (1, 3, 16), (1, 3, 1)], r"cont \(bottom\[2\]\) must have 2 axes"),
        ([(2, 3, 4), (2, 3, 16), (2, 3)], r"c_prev \(bottom\[0\]\) must be \(1, #streams"),
        ([(1, 3, 4), (1, 2, 16), (1, 3)], r"x \(bottom\[1\]\) must be \(1, #streams"),
    ],
)
def test_bad_shapes_raise(shapes, match):
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(LSTMUnit\).*" + match):
        make_layer("", shapes, type="LSTMUnit", n_tops=2)
