"""Exp: base ^ (shift + scale * x), base -1 meaning e; Caffe's base checks."""

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
    LayerCase("Exp", id="exp_default"),
    LayerCase("Exp", "exp_param { base: 2 scale: 0.5 shift: 0.3 }", id="exp_base_scale_shift"),
    LayerCase("Exp", "exp_param { scale: -1.2 shift: 0.7 }", ((4, 5, 3),), id="exp_e_shift"),
    LayerCase("Exp", "exp_param { base: 0.5 scale: 1 }", id="exp_base_below_one"),
    LayerCase("Exp", "exp_param { base: 1 shift: 2 }", id="exp_base_one"),
]


def ref_exp(x, base, scale, shift):
    b = math.e if base == -1 else base
    return np.power(b, shift + scale * x)


def ref_exp_diff(y, top_diff, base, scale):
    log_base = 1.0 if base == -1 else math.log(base)
    return top_diff * y * log_base * scale


@pytest.mark.parametrize(
    "params",
    [(-1, 1, 0), (2, 0.5, 0.3), (-1, -1.2, 0.7), (0.5, 1, 0), (10, 0.3, -1), (1, 1, 2)],
    ids=str,
)
def test_forward_backward_match_caffe(params):
    base, scale, shift = (float(np.float32(v)) for v in params)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 4, 5))
    top_diff = rng.standard_normal(x.shape)
    snippet = f"exp_param {{ base: {base} scale: {scale} shift: {shift} }}"
    layer, _ = make_layer(snippet, [x.shape], type="Exp", dtype=torch.float64)
    xt = torch.tensor(x, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff))
    want = ref_exp(x, base, scale, shift)
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(
        xt.grad.numpy(), ref_exp_diff(want, top_diff, base, scale), rtol=1e-12, atol=1e-300
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize("base", ["0", "-2", "inf", "nan"])
def test_error_base(base):
    with pytest.raises(LayerParamError, match=r"layer 'e1' \(Exp\).*base"):
        make_layer(f"exp_param {{ base: {base} }}", type="Exp", name="e1")
