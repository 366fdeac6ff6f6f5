"""Softmax: exp(x - max) / sum along an axis; gradient (dy - sum(dy * y)) * y."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Softmax", id="softmax_axis1"),
    LayerCase("Softmax", "softmax_param { axis: 2 }", ((2, 3, 4, 5),), id="softmax_axis2"),
    LayerCase(
        "Softmax", "softmax_param { axis: -1 engine: CAFFE }", ((3, 4, 5),), id="softmax_axis_neg1"
    ),
    LayerCase("Softmax", "softmax_param { axis: 0 }", ((4, 3),), id="softmax_axis0"),
]


def ref_softmax(x, axis):
    """Caffe's SoftmaxLayer::Forward_cpu: subtract the max over the axis, exp, divide by sum."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def ref_softmax_diff(y, top_diff, axis):
    """Caffe's Backward_cpu: (top_diff - dot(top_diff, y) over the axis) * y."""
    return (top_diff - (top_diff * y).sum(axis=axis, keepdims=True)) * y


@pytest.mark.parametrize(
    "shape,axis", [((2, 3, 4, 5), 1), ((2, 3, 4, 5), 2), ((3, 4, 5), -1), ((4, 3), 0)]
)
def test_forward_backward_match_reference(shape, axis):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape) * 4
    top_diff = rng.standard_normal(shape)
    layer, _ = make_layer(
        f"softmax_param {{ axis: {axis} }}", [shape], type="Softmax", dtype=torch.float64
    )
    xt = torch.tensor(x, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff))
    want = ref_softmax(x, axis)
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(
        xt.grad.numpy(), ref_softmax_diff(want, top_diff, axis), rtol=1e-10, atol=1e-14
    )


def test_forward_large_values_do_not_overflow():
    x = torch.tensor([[1000.0, 1001.0, 999.0], [-1e4, 0.0, 1e4]], dtype=torch.float32)
    layer, _ = make_layer("", [x.shape], type="Softmax")
    y = layer(x)
    assert torch.isfinite(y).all()
    np.testing.assert_allclose(y.numpy(), ref_softmax(x.double().numpy(), 1), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize("axis", [4, -5])
def test_error_axis_out_of_range(axis):
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(Softmax\).*axis"):
        make_layer(f"softmax_param {{ axis: {axis} }}", [(2, 3, 4, 5)], type="Softmax")
