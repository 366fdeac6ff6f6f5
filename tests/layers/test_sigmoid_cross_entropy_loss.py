"""SigmoidCrossEntropyLoss: Caffe's stable formula, soft targets, ignore_label, its normalizer
(BATCH_SIZE unless normalization or normalize is set) and gradient (sigmoid - t) * lw / norm."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError


def _logits_targets(shape, binary=False, ignore=None):
    def make(g):
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
        t = torch.rand(shape, generator=g, dtype=torch.float64)
        if binary:
            t = (t > 0.5).double()
        if ignore is not None:
            t.view(-1)[::5] = ignore
        return [x, t]

    return make


CASES = [
    LayerCase(
        "SigmoidCrossEntropyLoss",
        "",
        ((2, 3, 4, 5), (2, 3, 4, 5)),
        make_bottoms=_logits_targets((2, 3, 4, 5)),
        id="sce_soft_default",
    ),
    LayerCase(
        "SigmoidCrossEntropyLoss",
        "loss_param { ignore_label: -1 normalization: VALID }",
        ((4, 6), (4, 6)),
        make_bottoms=_logits_targets((4, 6), True, -1),
        id="sce_ignore_valid",
    ),
    LayerCase(
        "SigmoidCrossEntropyLoss",
        "loss_param { normalize: true }",
        ((3, 5), (3, 5)),
        make_bottoms=_logits_targets((3, 5)),
        id="sce_normalize_true",
    ),
]


def ref_sce(x, t, ignore, mode):
    """Caffe's Forward_cpu / Backward_cpu loops; returns (loss, diff for top diff 1)."""
    xf, tf = x.reshape(-1), t.reshape(-1)
    loss, count = 0.0, 0
    diff = 1 / (1 + np.exp(-xf)) - tf
    for i in range(xf.size):
        if ignore is not None and int(tf[i]) == ignore:
            diff[i] = 0
            continue
        pos = float(xf[i] >= 0)
        loss -= xf[i] * (tf[i] - pos) - np.log(1 + np.exp(xf[i] - 2 * xf[i] * pos))
        count += 1
    outer = x.shape[0]
    norm = {"FULL": xf.size, "VALID": count, "BATCH_SIZE": outer, "NONE": 1}[mode]
    norm = max(1.0, norm)
    return loss / norm, (diff / norm).reshape(x.shape)


@pytest.mark.parametrize(
    "loss_param,mode",
    [
        ("", "BATCH_SIZE"),  # the layer's own default, not the proto's VALID
        ("normalization: FULL", "FULL"),
        ("normalization: VALID", "VALID"),
        ("normalization: BATCH_SIZE", "BATCH_SIZE"),
        ("normalization: NONE", "NONE"),
        ("normalize: true", "VALID"),
        ("normalize: false", "BATCH_SIZE"),
        ("normalize: true normalization: NONE", "NONE"),
    ],
)
@pytest.mark.parametrize("ignore", [None, -1])
def test_forward_backward_match_reference(loss_param, mode, ignore):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 4, 5)) * 4
    x.flat[:3] = [0.0, 40.0, -40.0]
    t = rng.random((3, 4, 5))  # soft targets
    if ignore is not None:
        t.flat[::3] = ignore
    ign = "" if ignore is None else f"ignore_label: {ignore}"
    layer, _ = make_layer(
        f"loss_param {{ {loss_param} {ign} }}",
        [x.shape, t.shape],
        type="SigmoidCrossEntropyLoss",
        dtype=torch.float64,
    )
    xt = torch.tensor(x, requires_grad=True)
    loss = layer(xt, torch.tensor(t))
    lw = 0.7
    loss.backward(torch.tensor(lw, dtype=torch.float64))
    want, dx = ref_sce(x, t, ignore, mode)
    np.testing.assert_allclose(float(loss.detach()), want, rtol=1e-12)
    np.testing.assert_allclose(xt.grad.numpy(), lw * dx, rtol=1e-9, atol=1e-15)


def test_forward_float32_extreme_logits_finite():
    x = torch.tensor([[100.0, -100.0, 0.0]])
    t = torch.tensor([[0.0, 1.0, 0.5]])
    layer, _ = make_layer("", [x.shape, t.shape], type="SigmoidCrossEntropyLoss")
    loss = layer(x, t)
    assert float(loss) == pytest.approx(200.0 + np.log(2), rel=1e-6)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0], max_points=60)


def test_error_count_mismatch():
    with pytest.raises(LayerParamError, match=r"\(SigmoidCrossEntropyLoss\).*same count"):
        make_layer("", [(2, 3), (2, 4)], type="SigmoidCrossEntropyLoss")


def test_labels_get_no_forced_backward():
    layer, _ = make_layer("", [(2, 3), (2, 3)], type="SigmoidCrossEntropyLoss")
    assert layer.is_loss and not layer.allow_force_backward(1)
