"""Eltwise: SUM with coeffs, PROD with Caffe's stable and unstable gradients, MAX with Caffe's
mask (ties between bottoms 0 and 1 go to bottom 1, later bottoms win only when strictly
greater), and the parameter checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError, LayerParamError

S = (2, 3, 4, 5)


def _separated(n, shape):
    """n bottoms whose values are all at least 0.05 apart (no ties within a gradient step)."""

    def make(gen):
        count = int(np.prod(shape))
        values = (torch.randperm(n * count, generator=gen).double() - n * count / 2) * 0.05
        return list(values.reshape(n, *shape))

    return make


CASES = [
    LayerCase("Eltwise", "", (S, S)),
    LayerCase(
        "Eltwise", "eltwise_param { operation: SUM coeff: 0.5 coeff: -2 coeff: 1.5 }", (S, S, S)
    ),
    LayerCase("Eltwise", "eltwise_param { operation: PROD }", (S, S, S)),
    LayerCase(
        "Eltwise", "eltwise_param { operation: PROD stable_prod_grad: false }", ((3, 2, 5),) * 3
    ),
    LayerCase(
        "Eltwise", "eltwise_param { operation: MAX }", (S, S, S), make_bottoms=_separated(3, S)
    ),
]


def ref_forward_backward(op, arrays, top_diff, coeff=None, stable=True):
    """Caffe's Forward_cpu / Backward_cpu, written as its loops over bottoms."""
    n = len(arrays)
    if op == "SUM":
        coeff = coeff or [1.0] * n
        top = sum(c * a for c, a in zip(coeff, arrays))
        return top, [c * top_diff for c in coeff]
    if op == "PROD":
        top = arrays[0] * arrays[1]
        for a in arrays[2:]:
            top = top * a
        diffs = []
        for i in range(n):
            if stable:
                d = np.prod([arrays[j] for j in range(n) if j != i], axis=0)
            else:
                with np.errstate(divide="ignore", invalid="ignore"):
                    d = top / arrays[i]
            diffs.append(d * top_diff)
        return top, diffs
    mask = np.where(arrays[0] > arrays[1], 0, 1)
    top = np.where(mask == 0, arrays[0], arrays[1])
    for k in range(2, n):
        win = arrays[k] > top
        top = np.where(win, arrays[k], top)
        mask = np.where(win, k, mask)
    return top, [np.where(mask == i, top_diff, 0.0) for i in range(n)]


def _run(snippet, arrays, top_diff):
    layer, _ = make_layer(snippet, [a.shape for a in arrays], type="Eltwise", dtype=torch.float64)
    xs = [torch.tensor(a, requires_grad=True) for a in arrays]
    top = layer(*xs)
    top.backward(torch.tensor(top_diff))
    return top.detach().numpy(), [x.grad.numpy() for x in xs]


@pytest.mark.parametrize(
    "op,extra,coeff,stable",
    [
        ("SUM", "", None, True),
        ("SUM", "coeff: 0.5 coeff: -2 coeff: 1.5", [0.5, -2, 1.5], True),
        ("PROD", "", None, True),
        ("PROD", "stable_prod_grad: false", None, False),
        ("MAX", "", None, True),
    ],
)
def test_forward_backward_match_caffe(op, extra, coeff, stable):
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(S) for _ in range(3)]
    top_diff = rng.standard_normal(S)
    top, diffs = _run(f"eltwise_param {{ operation: {op} {extra} }}", arrays, top_diff)
    want_top, want_diffs = ref_forward_backward(op, arrays, top_diff, coeff, stable)
    np.testing.assert_allclose(top, want_top, rtol=1e-12)
    for got, want in zip(diffs, want_diffs):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_max_ties_follow_caffes_mask():
    """a == b: bottom 1 wins; c == max(a, b): the earlier winner keeps the gradient."""
    a = np.array([1.0, 2.0, 0.0, 3.0, -1.0])
    b = np.array([1.0, 1.0, 0.5, 3.0, -1.0])
    c = np.array([0.0, 2.0, 0.5, 3.0, -1.0])
    top_diff = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    top, diffs = _run("eltwise_param { operation: MAX }", [a, b, c], top_diff)
    want_top, want_diffs = ref_forward_backward("MAX", [a, b, c], top_diff)
    np.testing.assert_array_equal(top, want_top)
    for got, want in zip(diffs, want_diffs):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(diffs[1], [1.0, 0.0, 3.0, 4.0, 5.0])


def test_prod_unstable_gradient_divides_by_the_bottom():
    """A zero bottom: Caffe's unstable gradient is 0/0 = NaN there, the stable one is finite."""
    a = np.array([0.0, 2.0, -1.5])
    b = np.array([3.0, 0.5, 2.0])
    top_diff = np.array([1.0, -1.0, 0.5])
    _, unstable = _run(
        "eltwise_param { operation: PROD stable_prod_grad: false }", [a, b], top_diff
    )
    _, want = ref_forward_backward("PROD", [a, b], top_diff, stable=False)
    assert np.isnan(unstable[0][0])
    np.testing.assert_allclose(unstable[0], want[0], rtol=1e-12, equal_nan=True)
    _, stable = _run("eltwise_param { operation: PROD }", [a, b], top_diff)
    np.testing.assert_allclose(stable[0], b * top_diff, rtol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,shapes,field",
    [
        ("eltwise_param { coeff: 1 }", (S, S), "coeff"),
        ("eltwise_param { operation: PROD coeff: 1 coeff: 2 }", (S, S), "coeff"),
        ("", (S, (2, 3, 4, 6)), "shape"),
    ],
)
def test_error(snippet, shapes, field):
    with pytest.raises(LayerParamError, match=rf"layer 'e1' \(Eltwise\).*{field}"):
        make_layer(snippet, shapes, type="Eltwise", name="e1")


def test_error_needs_two_bottoms():
    with pytest.raises(BlobWiringError, match=r"layer 'e1' \(Eltwise\).*bottom"):
        make_layer("", [S], type="Eltwise", name="e1")
