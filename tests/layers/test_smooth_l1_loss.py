"""SmoothL1Loss (Fast R-CNN forks): 2 bottoms, 4 bottoms with inside/outside weights and sigma
(py-faster-rcnn), 3 bottoms with the SSD/brocolli fork's weight whose gradient omits w."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError


def _bottoms(shape, n):
    def make(g):
        out = [torch.randn(shape, generator=g, dtype=torch.float64) * 1.5 for _ in range(2)]
        out += [torch.rand(shape, generator=g, dtype=torch.float64) + 0.5 for _ in range(n - 2)]
        return out

    return make


CASES = [
    LayerCase(
        "SmoothL1Loss",
        "",
        ((3, 4, 2, 2), (3, 4, 2, 2)),
        make_bottoms=_bottoms((3, 4, 2, 2), 2),
        id="smoothl1_2bottoms",
    ),
    LayerCase(
        "SmoothL1Loss",
        "smooth_l1_loss_param { sigma: 3 }",
        ((2, 8),) * 4,
        make_bottoms=_bottoms((2, 8), 4),
        id="smoothl1_4bottoms_sigma",
    ),
    LayerCase(
        "SmoothL1Loss",
        "",
        ((2, 3, 4),) * 3,
        make_bottoms=_bottoms((2, 3, 4), 3),
        id="smoothl1_3bottoms_fork",
    ),
]


def ref_smooth_l1(a, b, w_in=None, w_out=None, sigma=1.0, fork3=False):
    """The forks' loops: d = w_in (a - b); f(d) = 0.5 s2 d^2 if |d| < 1 / s2 else
    |d| - 0.5 / s2; loss = sum(w_out f(d)) / N. Diff of a: f'(d) (* w_in * w_out unless the
    3-bottom fork) / N; of b: its negative."""
    s2 = float(np.float32(sigma) * np.float32(sigma))
    d = a - b if w_in is None else w_in * (a - b)
    f = np.where(np.abs(d) < 1 / s2, 0.5 * d * d * s2, np.abs(d) - 0.5 / s2)
    fp = np.where(np.abs(d) < 1 / s2, s2 * d, np.sign(d))
    if w_out is not None:
        f, fp = f * w_out, fp * w_in * w_out
    num = a.shape[0]
    return f.sum() / num, fp / num, -fp / num


@pytest.mark.parametrize("n,sigma", [(2, 1.0), (2, 2.0), (4, 1.0), (4, 3.0), (3, 1.0)])
def test_forward_backward_match_reference(n, sigma):
    rng = np.random.default_rng(n)
    shape = (3, 4, 2)
    bottoms = [rng.standard_normal(shape) * 2 for _ in range(2)]
    bottoms += [rng.random(shape) * 2 for _ in range(n - 2)]
    layer, _ = make_layer(
        f"smooth_l1_loss_param {{ sigma: {sigma} }}",
        [shape] * n,
        type="SmoothL1Loss",
        dtype=torch.float64,
    )
    ts = [torch.tensor(x, requires_grad=True) for x in bottoms]
    loss = layer(*ts)
    loss.backward(torch.tensor(2.0, dtype=torch.float64))
    kw = {}
    if n >= 3:
        kw["w_in"] = bottoms[2]
    if n == 4:
        kw["w_out"] = bottoms[3]
    want, da, db = ref_smooth_l1(*bottoms[:2], sigma=sigma, **kw)
    np.testing.assert_allclose(float(loss.detach()), want, rtol=1e-12)
    np.testing.assert_allclose(ts[0].grad.numpy(), 2 * da, rtol=1e-12)
    np.testing.assert_allclose(ts[1].grad.numpy(), 2 * db, rtol=1e-12)
    assert all(t.grad is None for t in ts[2:])


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0, 1], max_points=60)


def test_weight_bottoms_get_no_gradient():
    layer, _ = make_layer("", [(2, 3)] * 4, type="SmoothL1Loss")
    assert [layer.allow_force_backward(i) for i in range(4)] == [True, True, False, False]


@pytest.mark.parametrize(
    "shapes",
    [[(2, 3), (2, 4)], [(2, 3, 4), (2, 3, 4), (2, 3, 5)], [(2, 3), (2, 3), (2, 3), (3, 3)]],
)
def test_error_shape_mismatch(shapes):
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(SmoothL1Loss\).*bottom"):
        make_layer("", shapes, type="SmoothL1Loss")
