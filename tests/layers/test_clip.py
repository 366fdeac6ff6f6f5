"""Clip: max(min, min(x, max)); the gradient passes where min <= x <= max (bounds included)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Clip", "clip_param { min: -0.5 max: 0.8 }", id="clip"),
    LayerCase("Clip", "clip_param { min: 0 max: 6 }", ((3, 4, 5),), id="clip_relu6"),
    LayerCase("Clip", "clip_param { min: 1 max: -1 }", id="clip_min_above_max"),
]


@pytest.mark.parametrize("lo,hi", [(-0.5, 0.8), (0.0, 6.0), (-1.0, -1.0), (1.0, -1.0)])
def test_forward_backward_match_caffe_at_bounds(lo, hi):
    lo, hi = np.float32(lo), np.float32(hi)
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((2, 3, 4, 5)) * 2).astype(np.float32)
    x.flat[::5], x.flat[1::5] = lo, hi  # exactly on the bounds: gradient passes
    top_diff = rng.standard_normal(x.shape).astype(np.float32)
    layer, _ = make_layer(f"clip_param {{ min: {lo} max: {hi} }}", [x.shape], type="Clip")
    xt = torch.tensor(x, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff))
    np.testing.assert_array_equal(y.detach().numpy(), np.maximum(lo, np.minimum(x, hi)))
    np.testing.assert_array_equal(xt.grad.numpy(), top_diff * ((x >= lo) & (x <= hi)))


def test_gradient_is_caffes_mask_not_torch_clamps():
    """torch.clamp's gradient at a bound changed between releases (2.13 passed it, 2.14 passes
    none): a Clip that autograd records runs Caffe's own mask, whatever the torch."""
    layer, _ = make_layer("clip_param { min: -0.5 max: 0.8 }", [(2, 3)], type="Clip")
    x = torch.tensor([[-0.5, 0.8, 0.0], [-1.0, 2.0, float("nan")]], requires_grad=True)
    y = layer(x)
    assert "SlopeAtInput" in type(y.grad_fn).__name__
    y.backward(torch.full_like(y, 3.0))
    assert x.grad.tolist() == [[3.0, 3.0, 3.0], [0.0, 0.0, 0.0]]
    with torch.no_grad():  # inference: torch's clamp alone
        assert layer(x).grad_fn is None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    (x,) = bottoms
    for bound in (layer.min, layer.max):  # keep central differences off the kinks
        x = torch.where((x - bound).abs() < 0.02, x + 0.05, x)
    check_layer_gradient(layer, [x])


@pytest.mark.parametrize(
    "snippet,missing", [("clip_param { min: 0 }", "max"), ("clip_param { max: 1 }", "min")]
)
def test_error_missing_required_field(snippet, missing):
    with pytest.raises(LayerParamError, match=rf"layer 'c1' \(Clip\).*clip_param.*{missing}"):
        make_layer(snippet, type="Clip", name="c1")
