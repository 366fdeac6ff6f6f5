"""HingeLoss: sum max(0, 1 - d x)^p / N with d = +1 at the label, -1 elsewhere; L1 and L2."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe import runtime
from torchcaffe.errors import DataError, LayerParamError


def _scores_labels(shape, label_shape):
    def make(g):
        dim = int(np.prod(shape[1:]))
        return [
            torch.randn(shape, generator=g, dtype=torch.float64) * 2,
            torch.randint(0, dim, label_shape, generator=g).double(),
        ]

    return make


CASES = [
    LayerCase(
        "HingeLoss", "", ((4, 5), (4,)), make_bottoms=_scores_labels((4, 5), (4,)), id="hinge_l1"
    ),
    LayerCase(
        "HingeLoss",
        "hinge_loss_param { norm: L2 }",
        ((3, 2, 2, 2), (3, 1, 1, 1)),
        make_bottoms=_scores_labels((3, 2, 2, 2), (3, 1, 1, 1)),
        id="hinge_l2_4d",
    ),
]


def ref_hinge(x, label, norm):
    """Caffe's loops: negate the label's score, max(0, 1 + v), asum or dot over N; diff is
    sign (L1) or 2 v (L2), with the label's sign flipped back, over N."""
    num = x.shape[0]
    v = x.reshape(num, -1).copy()
    for i in range(num):
        v[i, int(label.reshape(-1)[i])] *= -1
    v = np.maximum(0, 1 + v)
    loss = (np.abs(v).sum() if norm == "L1" else (v * v).sum()) / num
    d = v.copy()
    for i in range(num):
        d[i, int(label.reshape(-1)[i])] *= -1
    d = np.sign(d) / num if norm == "L1" else 2 * d / num
    return loss, d.reshape(x.shape)


@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_forward_backward_match_reference(norm):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((4, 3, 2)) * 1.5
    label = rng.integers(0, 6, (4,)).astype(np.float64)
    x.reshape(4, 6)[0, :] = [1.0, -1.0, 0.0, 2.0, -2.0, 0.5]  # at the hinge, both sides
    layer, _ = make_layer(
        f"hinge_loss_param {{ norm: {norm} }}",
        [x.shape, label.shape],
        type="HingeLoss",
        dtype=torch.float64,
    )
    xt = torch.tensor(x, requires_grad=True)
    loss = layer(xt, torch.tensor(label))
    loss.backward(torch.tensor(3.0, dtype=torch.float64))
    want, dx = ref_hinge(x, label, norm)
    np.testing.assert_allclose(float(loss.detach()), want, rtol=1e-12)
    np.testing.assert_allclose(xt.grad.numpy(), 3.0 * dx, rtol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0], kink=1.0, kink_range=0.05)


def test_error_label_out_of_range(monkeypatch):
    monkeypatch.setattr(runtime, "_check_labels", True)  # opt-in: it syncs with the device
    layer, _ = make_layer("", [(2, 3), (2,)], type="HingeLoss")
    with pytest.raises(DataError, match=r"layer 'layer' \(HingeLoss\).*label"):
        layer(torch.zeros(2, 3), torch.tensor([0.0, 3.0]))


def test_error_first_dimension():
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(HingeLoss\).*first dimension"):
        make_layer("", [(2, 3), (3,)], type="HingeLoss")
