"""MultinomialLogisticLoss: -log(max(p[label], 1e-20)) / N; Caffe's gradient keeps the
1 / max(p, 1e-20) factor where the clamp is active."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe import runtime
from torchcaffe.errors import DataError, LayerParamError

THRESHOLD = float(np.float32(1e-20))  # kLOG_THRESHOLD is a float constant


def _probs_labels(num, dim, label_shape):
    def make(g):
        p = torch.rand(num, dim, generator=g, dtype=torch.float64) * 0.8 + 0.1
        return [p, torch.randint(0, dim, label_shape, generator=g).double()]

    return make


CASES = [
    LayerCase(
        "MultinomialLogisticLoss",
        "",
        ((4, 5), (4,)),
        make_bottoms=_probs_labels(4, 5, (4,)),
        id="mll_2d",
    ),
    LayerCase(
        "MultinomialLogisticLoss",
        "",
        ((3, 6), (3, 1, 1, 1)),
        make_bottoms=_probs_labels(3, 6, (3, 1, 1, 1)),
        id="mll_label_4d",
    ),
]


def ref_mll(p, label):
    """Caffe's loops: loss -= log(max(p, thr)); diff[label] = -1 / (num * max(p, thr))."""
    num = p.shape[0]
    flat = p.reshape(num, -1)
    loss, diff = 0.0, np.zeros_like(flat)
    for i in range(num):
        k = int(label.reshape(-1)[i])
        prob = max(flat[i, k], THRESHOLD)
        loss -= np.log(prob)
        diff[i, k] = -1 / num / prob
    return loss / num, diff.reshape(p.shape)


def test_forward_backward_match_reference_with_clamp():
    rng = np.random.default_rng(2)
    p = rng.random((4, 3, 1, 2))
    label = np.array([0.0, 5.0, 2.0, 3.0])
    p.reshape(4, 6)[1, 5] = 0.0  # clamped: loss -log(1e-20), diff -1 / (N 1e-20)
    layer, _ = make_layer(
        "", [p.shape, label.shape], type="MultinomialLogisticLoss", dtype=torch.float64
    )
    pt = torch.tensor(p, requires_grad=True)
    loss = layer(pt, torch.tensor(label))
    loss.backward(torch.tensor(0.5, dtype=torch.float64))
    want, dp = ref_mll(p, label)
    np.testing.assert_allclose(float(loss.detach()), want, rtol=1e-12)
    np.testing.assert_allclose(pt.grad.numpy(), 0.5 * dp, rtol=1e-12)
    assert pt.grad.reshape(4, 6)[1, 5] != 0


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0])


def test_error_label_shape():
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(MultinomialLogisticLoss\).*label"):
        make_layer("", [(3, 4), (3, 2)], type="MultinomialLogisticLoss")


def test_error_label_out_of_range(monkeypatch):
    monkeypatch.setattr(runtime, "_check_labels", True)  # opt-in: it syncs with the device
    layer, _ = make_layer("", [(2, 3), (2,)], type="MultinomialLogisticLoss")
    with pytest.raises(DataError, match=r"\(MultinomialLogisticLoss\).*label"):
        layer(torch.full((2, 3), 0.3), torch.tensor([0.0, -1.0]))
