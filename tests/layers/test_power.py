"""Power: (shift + scale * x) ^ power with Caffe's special cases and Caffe's backward, which
divides the output by the base (NaN where the base is 0) and is 0 when power * scale is 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer


def _positive(shape):
    return lambda g: [torch.rand(shape, generator=g, dtype=torch.float64) + 0.2]


def _snippet(power, scale, shift):
    return f"power_param {{ power: {power} scale: {scale} shift: {shift} }}"


CASES = [
    LayerCase("Power", id="power_default"),
    LayerCase("Power", _snippet(2, 0.5, 1), id="power_sq"),
    LayerCase(
        "Power", _snippet(0.5, 2, 0.1), make_bottoms=_positive((2, 3, 4, 5)), id="power_frac"
    ),
    LayerCase("Power", _snippet(1, -0.7, 2), ((3, 4, 5),), id="power_scale_shift_only"),
    LayerCase("Power", _snippet(3, 1.5, 0), id="power_cube_no_shift"),
    LayerCase(
        "Power",
        _snippet(-1.5, 2, 0),
        make_bottoms=_positive((2, 3, 4, 5)),
        id="power_negative_no_shift",
    ),
    LayerCase("Power", _snippet(0, 2, 1), id="power_zero"),
    LayerCase("Power", _snippet(2.5, 0, 3), id="power_scale_zero"),
]


def ref_power(x, power, scale, shift):
    """Caffe's forward: the input is ignored when power * scale == 0."""
    if power * scale == 0:
        return np.full_like(x, 1.0 if power == 0 else np.power(shift, power))
    return np.power(shift + scale * x, power)


def ref_power_diff(x, y, top_diff, power, scale, shift):
    """Caffe's PowerLayer::Backward_cpu, branch by branch."""
    diff_scale = power * scale
    if diff_scale == 0:
        return np.zeros_like(x)
    if power == 1:
        dydx = np.full_like(x, diff_scale)
    elif power == 2:
        dydx = diff_scale * scale * x + diff_scale * shift
    elif shift == 0:
        dydx = power * y / x
    else:
        dydx = diff_scale * y / (shift + scale * x)
    return top_diff * dydx


def _forward_backward(params, x, top_diff):
    layer, _ = make_layer(_snippet(*params), [x.shape], type="Power", dtype=torch.float64)
    xt = torch.tensor(x, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff))
    return y.detach().numpy(), xt.grad.numpy()


PARAMS = [
    (1, 1, 0),
    (2, 0.5, 1),
    (2, -1.5, 0),
    (0.5, 2, 0.1),
    (1, -0.7, 2),
    (3, 1.5, 0),
    (-1.5, 2, 0),
    (1.7, 0.5, 2),
    (0, 2, 1),
    (2.5, 0, 3),
    (0.5, 0, -2),
    (-2, 0, 0),
]


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_forward_backward_match_caffe(params):
    power, scale, shift = (float(np.float32(v)) for v in params)
    rng = np.random.default_rng(5)
    x = rng.uniform(0.3, 2.0, (2, 3, 4, 5))
    if float(power).is_integer():
        x = x * rng.choice([-1.0, 1.0], x.shape)
    top_diff = rng.standard_normal(x.shape)
    y, dx = _forward_backward((power, scale, shift), x, top_diff)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = ref_power(x, power, scale, shift)
        np.testing.assert_allclose(y, want, rtol=1e-12)
        np.testing.assert_allclose(
            dx, ref_power_diff(x, want, top_diff, power, scale, shift), rtol=1e-9
        )


@pytest.mark.parametrize("params", [(3, 1.5, 0), (0.5, 2, 0), (1.5, 2, -1), (-1, 1, 0)], ids=str)
def test_backward_where_base_is_zero_is_caffes(params):
    """Caffe divides by the base: 0/0 = NaN (or y/0 = inf), where calculus says 0 or inf."""
    power, scale, shift = params
    x = np.array([0.5, -shift / scale, 1.25, 2.0])
    top_diff = np.array([1.0, 0.75, -2.0, 0.5])
    y, dx = _forward_backward(params, x, top_diff)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = ref_power_diff(x, ref_power(x, *params), top_diff, *params)
    assert not np.isfinite(want[1])
    np.testing.assert_allclose(dx, want, rtol=1e-12, equal_nan=True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, step=1e-3)
