"""Log: log_base(shift + scale * x), base -1 meaning e; Caffe's base checks (not 1, > 0)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError


def _positive(shape):
    return lambda g: [torch.rand(shape, generator=g, dtype=torch.float64) * 2 + 0.3]


CASES = [
    LayerCase("Log", make_bottoms=_positive((2, 3, 4, 5)), id="log_default"),
    LayerCase(
        "Log",
        "log_param { base: 10 scale: 2 shift: 0.5 }",
        make_bottoms=_positive((2, 3, 4, 5)),
        id="log_base_scale_shift",
    ),
    LayerCase(
        "Log",
        "log_param { base: 0.5 scale: -1 shift: 3 }",
        ((3, 4, 2),),
        make_bottoms=_positive((3, 4, 2)),
        id="log_base_below_one",
    ),
]


def ref_log(x, base, scale, shift):
    log_base = 1.0 if base == -1 else math.log(base)
    return np.log(shift + scale * x) / log_base


def ref_log_diff(x, top_diff, base, scale, shift):
    log_base = 1.0 if base == -1 else math.log(base)
    return top_diff * scale / log_base / (shift + scale * x)


@pytest.mark.parametrize(
    "params", [(-1, 1, 0), (10, 2, 0.5), (0.5, -1, 3), (2, 1, 0), (-1, 3, -0.2)], ids=str
)
def test_forward_backward_match_caffe(params):
    base, scale, shift = (float(np.float32(v)) for v in params)
    rng = np.random.default_rng(7)
    x = rng.uniform(0.3, 2.3, (2, 3, 4, 5))
    top_diff = rng.standard_normal(x.shape)
    snippet = f"log_param {{ base: {base} scale: {scale} shift: {shift} }}"
    layer, _ = make_layer(snippet, [x.shape], type="Log", dtype=torch.float64)
    xt = torch.tensor(x, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff))
    np.testing.assert_allclose(
        y.detach().numpy(), ref_log(x, base, scale, shift), rtol=1e-12, atol=1e-15
    )
    np.testing.assert_allclose(
        xt.grad.numpy(), ref_log_diff(x, top_diff, base, scale, shift), rtol=1e-12
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize("base", ["0", "-3", "1", "inf"])
def test_error_base(base):
    with pytest.raises(LayerParamError, match=r"layer 'l1' \(Log\).*base"):
        make_layer(f"log_param {{ base: {base} }}", type="Log", name="l1")
