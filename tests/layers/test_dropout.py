"""Dropout: TRAIN keeps each element with probability 1 - ratio and scales by 1 / (1 - ratio);
TEST is the identity; phase follows ``self.training``; the fork fields scale_train and
sample_weights_test. Masks come from torch's RNG, so TRAIN is checked statistically."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Dropout", "dropout_param { dropout_ratio: 0.3 }", phase="TEST", id="dropout_test"),
    LayerCase(
        "Dropout",
        "dropout_param { dropout_ratio: 0.4 }",
        ((4, 5, 6),),
        deterministic=False,
        id="dropout_train",
    ),
    LayerCase(
        "Dropout",
        "dropout_param { dropout_ratio: 0.25 scale_train: false }",
        deterministic=False,
        id="dropout_train_no_scale",
    ),
    LayerCase(
        "Dropout",
        "dropout_param { dropout_ratio: 0.25 scale_train: false }",
        phase="TEST",
        id="dropout_test_no_scale",
    ),
    LayerCase(
        "Dropout",
        "dropout_param { sample_weights_test: true }",
        phase="TEST",
        deterministic=False,
        id="dropout_test_sampled",
    ),
]

N = 200_000  # elements for the statistical checks: 5 sigma of the kept fraction is < 0.006


def _layer(snippet, phase, shape=(N,)):
    layer, _ = make_layer(snippet, [shape], type="Dropout", phase=phase, dtype=torch.float64)
    return layer


def _x(shape=(N,), seed=0):
    return (
        torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.5
    )  # no zeros: y == 0 means dropped


def _assert_fraction(dropped, ratio):
    sigma = math.sqrt(ratio * (1 - ratio) / dropped.numel())
    frac = dropped.double().mean().item()
    assert abs(frac - ratio) < 5 * sigma + 1e-12, f"dropped {frac:.4f}, expected {ratio}"


@pytest.mark.parametrize("ratio", [0.5, 0.4, 0.1, 0.9])
def test_train_mask_and_scale(ratio):
    ratio = float(np.float32(ratio))
    layer = _layer(f"dropout_param {{ dropout_ratio: {ratio} }}", "TRAIN")
    x = _x().requires_grad_(True)
    y = layer(x)
    kept = y != 0
    _assert_fraction(~kept, ratio)
    torch.testing.assert_close(y[kept], x[kept] / (1 - ratio), rtol=1e-12, atol=0)
    top_diff = torch.randn(N, dtype=torch.float64)
    y.backward(top_diff)
    torch.testing.assert_close(x.grad, top_diff * kept / (1 - ratio), rtol=1e-12, atol=0)
    # unbiased: E[y] = E[x], within 5 sigma of the mean of N scaled Bernoulli draws
    sigma = math.sqrt((x.detach() ** 2).mean().item() * ratio / (1 - ratio) / N)
    assert abs(y.mean().item() - x.mean().item()) < 5 * sigma


def test_train_masks_are_independent_draws():
    layer = _layer("", "TRAIN")
    x = _x()
    a, b = layer(x) != 0, layer(x) != 0
    assert not torch.equal(a, b)
    _assert_fraction(~a & ~b, 0.25)  # independent draws: both dropped with ratio^2


@pytest.mark.parametrize("ratio", [0.3, 0.0])
def test_test_phase_is_identity(ratio):
    layer = _layer(f"dropout_param {{ dropout_ratio: {ratio} }}", "TEST", shape=(3, 4, 5))
    x = _x((3, 4, 5)).requires_grad_(True)
    y = layer(x)
    torch.testing.assert_close(y, x, rtol=0, atol=0)
    y.backward(torch.full_like(x, 2.0))
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0), rtol=0, atol=0)


def test_ratio_zero_trains_as_identity():
    layer = _layer("dropout_param { dropout_ratio: 0 }", "TRAIN", shape=(3, 4, 5))
    x = _x((3, 4, 5))
    torch.testing.assert_close(layer(x), x, rtol=0, atol=0)


def test_follows_train_and_eval():
    layer = _layer("dropout_param { dropout_ratio: 0.5 }", "TEST")
    x = _x()
    assert torch.equal(layer(x), x)
    layer.train()
    _assert_fraction(layer(x) == 0, 0.5)
    layer.eval()
    assert torch.equal(layer(x), x)


def test_scale_train_false():
    """py-faster-rcnn: TRAIN drops without scaling, TEST multiplies by 1 - ratio."""
    snippet = "dropout_param { dropout_ratio: 0.25 scale_train: false }"
    layer = _layer(snippet, "TRAIN")
    x = _x().requires_grad_(True)
    y = layer(x)
    kept = y != 0
    _assert_fraction(~kept, 0.25)
    torch.testing.assert_close(y[kept], x[kept], rtol=0, atol=0)
    y.backward(torch.ones_like(x))
    torch.testing.assert_close(x.grad, kept.double(), rtol=0, atol=0)
    layer.eval()
    torch.testing.assert_close(layer(x), x * 0.75, rtol=1e-12, atol=0)


def test_sample_weights_test_samples_in_test_phase():
    """Bayesian SegNet: masks are drawn in TEST as in TRAIN."""
    layer = _layer("dropout_param { dropout_ratio: 0.3 sample_weights_test: true }", "TEST")
    x = _x()
    y = layer(x)
    kept = y != 0
    _assert_fraction(~kept, float(np.float32(0.3)))
    torch.testing.assert_close(y[kept], x[kept] / (1 - float(np.float32(0.3))), rtol=1e-12, atol=0)


def test_gradient_train_fixed_seed():
    layer, bottoms = make_layer(
        "dropout_param { dropout_ratio: 0.4 }", [(2, 3, 4, 5)], type="Dropout", phase="TRAIN"
    )
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize("ratio", ["1", "1.5", "-0.1"])
def test_error_ratio_out_of_range(ratio):
    with pytest.raises(LayerParamError, match=r"layer 'd1' \(Dropout\).*dropout_ratio"):
        make_layer(f"dropout_param {{ dropout_ratio: {ratio} }}", type="Dropout", name="d1")
