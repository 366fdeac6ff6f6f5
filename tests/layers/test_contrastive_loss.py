"""ContrastiveLoss: similar pairs d^2, dissimilar max(margin - d, 0)^2 (or the legacy
max(margin - d^2, 0)), over 2N; Caffe's gradient divides by d + 1e-4."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError


def _pairs(num, channels, four_d=False):
    def make(g):
        shape = (num, channels, 1, 1) if four_d else (num, channels)
        a = torch.rand(shape, generator=g, dtype=torch.float64) * 0.6
        b = torch.rand(shape, generator=g, dtype=torch.float64) * 0.6
        y = (torch.rand(num, generator=g) > 0.5).double()
        return [a, b, y.reshape(num, 1, 1, 1) if four_d else y]

    return make


CASES = [
    LayerCase(
        "ContrastiveLoss",
        "contrastive_loss_param { margin: 1.5 }",
        ((5, 3), (5, 3), (5,)),
        make_bottoms=_pairs(5, 3),
        id="contrastive",
    ),
    LayerCase(
        "ContrastiveLoss",
        "contrastive_loss_param { margin: 0.8 legacy_version: true }",
        ((4, 6, 1, 1), (4, 6, 1, 1), (4, 1, 1, 1)),
        make_bottoms=_pairs(4, 6, True),
        id="contrastive_legacy",
    ),
]


def ref_contrastive(a, b, y, margin, legacy):
    """Caffe's Forward_cpu / Backward_cpu loops; returns (loss, diff a, diff b)."""
    num = a.shape[0]
    d = (a - b).reshape(num, -1)
    loss, da = 0.0, np.zeros_like(d)
    for i in range(num):
        dsq = d[i] @ d[i]
        if int(y.reshape(-1)[i]):
            loss += dsq
            da[i] = d[i] / num
        elif legacy:
            loss += max(margin - dsq, 0.0)
            da[i] = -d[i] / num if margin - dsq > 0 else 0
        else:
            dist = np.sqrt(dsq)
            loss += max(margin - dist, 0.0) ** 2
            mdist = margin - dist
            da[i] = -mdist / (dist + 1e-4) * d[i] / num if mdist > 0 else 0
    return loss / num / 2, da.reshape(a.shape), -da.reshape(a.shape)


@pytest.mark.parametrize("legacy", [False, True])
def test_forward_backward_match_reference(legacy):
    rng = np.random.default_rng(11)
    a, b = rng.random((6, 4)) * 0.7, rng.random((6, 4)) * 0.7
    b[0] = a[0]  # a coincident dissimilar pair: Caffe's gradient is 0, not NaN
    y = np.array([0.0, 1.0, 0.0, 0.7, 2.0, 0.0])  # 0.7 truncates to 0: dissimilar
    margin = 0.9
    layer, _ = make_layer(
        f"contrastive_loss_param {{ margin: {margin} legacy_version: {str(legacy).lower()} }}",
        [a.shape, b.shape, y.shape],
        type="ContrastiveLoss",
        dtype=torch.float64,
    )
    at, bt = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    loss = layer(at, bt, torch.tensor(y))
    loss.backward(torch.tensor(2.0, dtype=torch.float64))
    want, da, db = ref_contrastive(a, b, y, np.float32(margin), legacy)
    np.testing.assert_allclose(float(loss.detach()), want, rtol=1e-7)  # margin is a float
    np.testing.assert_allclose(at.grad.numpy(), 2 * da, rtol=1e-7, atol=1e-15)
    np.testing.assert_allclose(bt.grad.numpy(), 2 * db, rtol=1e-7, atol=1e-15)
    assert torch.isfinite(at.grad).all()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    # Caffe's d + 1e-4 denominator is within the checker's tolerance at these distances
    check_layer_gradient(layer, bottoms, bottom_indices=[0, 1])


def test_similarity_bottom_gets_no_gradient():
    layer, _ = make_layer("", [(2, 3), (2, 3), (2,)], type="ContrastiveLoss")
    assert layer.allow_force_backward(0) and layer.allow_force_backward(1)
    assert not layer.allow_force_backward(2)


@pytest.mark.parametrize(
    "shapes,field",
    [
        (((2, 3), (2, 4), (2,)), "channels"),
        (((2, 3, 2), (2, 3, 2), (2,)), "height"),
        (((2, 3), (2, 3), (2, 2)), "channels"),
        (((2, 3), (2, 3), (1,)), "similarity"),
    ],
)
def test_error_shapes(shapes, field):
    with pytest.raises(LayerParamError, match=rf"layer 'layer' \(ContrastiveLoss\).*{field}"):
        make_layer("", shapes, type="ContrastiveLoss")
