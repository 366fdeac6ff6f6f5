"""AbsVal: |x|, gradient sign(x) with sign(0) = 0; Caffe refuses in-place use."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("AbsVal", id="absval_default"),
    LayerCase("AbsVal", bottom_shapes=((6, 5),), id="absval_2d"),
]


def test_forward_backward_match_caffe_with_zeros():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4, 5))
    x.flat[::5] = 0.0
    top_diff = rng.standard_normal(x.shape)
    layer, _ = make_layer("", [x.shape], type="AbsVal", dtype=torch.float64)
    xt = torch.tensor(x, requires_grad=True)
    y = layer(xt)
    y.backward(torch.tensor(top_diff))
    sign = (x > 0).astype(float) - (x < 0)  # caffe_sign: 0 at 0
    np.testing.assert_array_equal(y.detach().numpy(), np.where(x < 0, -x, x))
    np.testing.assert_array_equal(xt.grad.numpy(), top_diff * sign)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, kink=0.0, kink_range=0.01)


def test_error_in_place():
    with pytest.raises(LayerParamError, match=r"layer 'a1' \(AbsVal\).*in-place"):
        make_layer("bottom: 'x' top: 'x'", type="AbsVal", name="a1")
