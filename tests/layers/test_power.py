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


POWER_LOG_IN_PLACE = """
force_backward: true
layer { name: "in" type: "Input" top: "a" top: "b" top: "c"
  input_param { shape { dim: 1 dim: 4 } } }
layer { name: "pw" type: "Power" bottom: "a" top: "a"
  power_param { power: 2 scale: 0.5 shift: 0.2 } }
layer { name: "p1" type: "Power" bottom: "b" top: "b"
  power_param { power: 1 scale: -3 shift: 0.5 } }
layer { name: "lg" type: "Log" bottom: "c" top: "c" log_param { base: 2 scale: 2 shift: 0.1 } }
"""


def test_power_and_log_in_place_square_their_slope_as_caffe(tmp_path):
    # In place, Power's and Log's Backward_cpu write the slope into the bottom diff, which is
    # the top diff, then multiply it by itself: the top diff is lost. Expected values computed
    # by BVLC Caffe 1.0 built from source (CPU, OpenBLAS), pycaffe forward() then backward().
    import torchcaffe as caffe

    path = tmp_path / "net.prototxt"
    path.write_text(POWER_LOG_IN_PLACE)
    net = caffe.Net(str(path), caffe.TRAIN)
    x = np.array([[0.5, -1.0, 2.0, 0.25]], np.float32)
    for k in "abc":
        net.blobs[k].data[...] = np.abs(x) if k == "c" else x
    g = np.array([[1.5, -2.0, 0.5, 3.0]], np.float32)
    net.forward()
    for k in "abc":
        net.blobs[k].diff[...] = g
    net.backward()
    want = {
        "a": ([0.20249999, 0.09, 1.44, 0.10562499], [0.09075155, 0.060025003, 0.8464, 0.063914165]),
        "b": ([-1.0, 3.5, -5.5, -0.25], [9.0, 9.0, 9.0, 9.0]),
        "c": (
            [0.13750355, 1.0703893, 2.0356238, -0.73696554],
            [59.20114, 1.6581018, 0.4784947, 4.4104123],
        ),
    }
    for k, (data, diff) in want.items():
        np.testing.assert_allclose(net.blobs[k].data.ravel(), data, rtol=1e-5, err_msg=k)
        np.testing.assert_allclose(net.blobs[k].diff.ravel(), diff, rtol=1e-5, err_msg=k)


def test_power_in_place_autograd_squares_its_slope():
    # the module's own backward (torch face): the same numbers as the Caffe face above
    layer, _ = make_layer(
        'bottom: "a" top: "a" power_param { power: 2 scale: 0.5 shift: 0.2 }',
        [(1, 4)],
        type="Power",
    )
    x = torch.tensor([[0.5, -1.0, 2.0, 0.25]], requires_grad=True)
    layer(x).backward(torch.tensor([[1.5, -2.0, 0.5, 3.0]]))
    want = [0.09075155, 0.060025003, 0.8464, 0.063914165]  # BVLC Caffe, as above
    np.testing.assert_allclose(x.grad.numpy().ravel(), want, rtol=1e-5)
