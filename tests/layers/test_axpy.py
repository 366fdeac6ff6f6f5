"""Axpy (SENet): top = a * x + y with a of shape (N, C) or (N, C, 1, 1); x, 2-D to 4-D.

Reference: hujie-frank/SENet src/caffe/layers/axpy_layer.cpp (Forward_cpu copies y, then
caffe_axpy(spatial_dim, a[n * C + c], ...) per slice; Backward_cpu: a's diff is the slice sum
of top_diff * x, x's diff a * top_diff, y's diff top_diff).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Axpy", "", ((2, 3, 1, 1), (2, 3, 4, 5), (2, 3, 4, 5)), id="axpy_nc11"),
    LayerCase("Axpy", "", ((3, 4), (3, 4, 5), (3, 4, 5)), id="axpy_nc_3d"),
    LayerCase("Axpy", "", ((4, 2), (4, 2), (4, 2)), id="axpy_2d"),
]


def ref_axpy(a, x, y):
    """Per (n, c): top[n, c] = y[n, c] + a[n, c] * x[n, c] (a read as N*C values)."""
    n, c = x.shape[:2]
    flat_a = a.reshape(n * c)
    xs, ys = x.reshape(n * c, -1), y.reshape(n * c, -1)
    top = np.stack([ys[i] + flat_a[i] * xs[i] for i in range(n * c)])
    return top.reshape(x.shape)


def ref_axpy_diff(a, x, top_diff):
    n, c = x.shape[:2]
    g, xs = top_diff.reshape(n * c, -1), x.reshape(n * c, -1)
    da = np.array([(g[i] * xs[i]).sum() for i in range(n * c)]).reshape(a.shape)
    dx = (g * a.reshape(n * c, 1)).reshape(x.shape)
    return da, dx, top_diff


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_backward_match_reference(case):
    rng = np.random.default_rng(9)
    arrays = [rng.standard_normal(s) for s in case.bottom_shapes]
    layer, _ = make_layer("", case.bottom_shapes, type="Axpy", dtype=torch.float64)
    ts = [torch.tensor(v, requires_grad=True) for v in arrays]
    top = layer(*ts)
    want = ref_axpy(*arrays)
    np.testing.assert_allclose(top.detach().numpy(), want, rtol=1e-14)
    assert layer.output_shapes(case.bottom_shapes) == [want.shape]
    top_diff = rng.standard_normal(want.shape)
    top.backward(torch.tensor(top_diff))
    for t, w in zip(ts, ref_axpy_diff(arrays[0], arrays[1], top_diff)):
        np.testing.assert_allclose(t.grad.numpy(), w, rtol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "shapes,match",
    [
        (((2, 4), (2, 3, 4, 5), (2, 3, 4, 5)), r"\(N, C\) = \(2, 3\)"),
        (((2, 3, 2, 1), (2, 3, 4, 5), (2, 3, 4, 5)), r"scale a"),
        (((3,), (3,), (3,)), r"scale a"),
        (((2, 3), (2, 3, 4, 5), (2, 3, 5, 4)), r"same shape"),
    ],
)
def test_error_shapes(shapes, match):
    with pytest.raises(LayerParamError, match=rf"layer 'a1' \(Axpy\).*{match}"):
        make_layer("", shapes, type="Axpy", name="a1")
