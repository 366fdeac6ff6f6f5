"""EuclideanLoss: sum((a - b)^2) / N / 2 with gradients to both bottoms."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("EuclideanLoss", "", ((2, 3, 4, 5), (2, 3, 4, 5)), id="euclidean_4d"),
    LayerCase(
        "EuclideanLoss", "loss_weight: 2.5", ((3, 12), (3, 3, 4)), id="euclidean_reshaped_lw"
    ),
]


def ref_euclidean(a, b):
    """Caffe: diff = a - b, loss = dot(diff, diff) / num / 2; diffs +-diff / num."""
    diff = a.reshape(-1) - b.reshape(-1)
    num = a.shape[0]
    return diff @ diff / num / 2, (diff / num).reshape(a.shape), (-diff / num).reshape(b.shape)


@pytest.mark.parametrize("shapes", [((2, 3, 4, 5), (2, 3, 4, 5)), ((3, 12), (3, 3, 4))])
def test_forward_backward_match_reference(shapes):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1])
    layer, _ = make_layer("", shapes, type="EuclideanLoss", dtype=torch.float64)
    at, bt = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    loss = layer(at, bt)
    lw = 2.5
    loss.backward(torch.tensor(lw, dtype=torch.float64))
    want, da, db = ref_euclidean(a, b)
    assert loss.shape == ()
    np.testing.assert_allclose(float(loss.detach()), want, rtol=1e-12)
    np.testing.assert_allclose(at.grad.numpy(), lw * da, rtol=1e-12)
    np.testing.assert_allclose(bt.grad.numpy(), lw * db, rtol=1e-12)


def test_both_bottoms_allow_force_backward():
    layer, _ = make_layer("", [(2, 3), (2, 3)], type="EuclideanLoss")
    assert layer.is_loss and layer.allow_force_backward(0) and layer.allow_force_backward(1)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, max_points=60)


def test_error_dimension_mismatch():
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(EuclideanLoss\).*dimension"):
        make_layer("", [(2, 3, 4), (2, 3, 5)], type="EuclideanLoss")


def test_error_first_dimension():
    with pytest.raises(LayerParamError, match=r"\(EuclideanLoss\).*first dimension"):
        make_layer("", [(2, 6), (3, 4)], type="EuclideanLoss")
