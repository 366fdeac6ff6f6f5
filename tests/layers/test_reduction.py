"""Reduction: SUM / ASUM / SUMSQ / MEAN over all axes from ``axis`` on, with coeff (MEAN
divides it by the reduced count), forward and Caffe's backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Reduction", ""),
    LayerCase("Reduction", "reduction_param { operation: ASUM axis: 1 coeff: 0.5 }"),
    LayerCase("Reduction", "reduction_param { operation: SUMSQ axis: 2 coeff: 2 }"),
    LayerCase("Reduction", "reduction_param { operation: MEAN axis: -1 coeff: -2 }"),
]


def ref_reduction(x, top_diff, op, axis, coeff):
    """Caffe's Forward_cpu / Backward_cpu on the (num, dim) view of the bottom."""
    axis = axis % x.ndim
    flat = x.reshape(int(np.prod(x.shape[:axis])), -1)
    dim = flat.shape[1]
    c = coeff / dim if op == "MEAN" else coeff
    top = {
        "SUM": flat.sum(1),
        "MEAN": flat.sum(1),
        "ASUM": np.abs(flat).sum(1),
        "SUMSQ": (flat * flat).sum(1),
    }[op] * c
    g = (top_diff.reshape(-1) * c)[:, None]
    diff = {
        "SUM": np.broadcast_to(g, flat.shape),
        "MEAN": np.broadcast_to(g, flat.shape),
        "ASUM": np.sign(flat) * g,
        "SUMSQ": 2 * g * flat,
    }[op]
    return top.reshape(x.shape[:axis]), diff.reshape(x.shape)


@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
@pytest.mark.parametrize("axis,coeff", [(0, 1.0), (1, 0.5), (2, 2.0), (-1, -2.0), (3, 1.0)])
def test_forward_backward_match_caffe(op, axis, coeff):
    shape = (2, 3, 4, 5)
    snippet = f"reduction_param {{ operation: {op} axis: {axis} coeff: {coeff} }}"
    layer, (x,) = make_layer(snippet, [shape], type="Reduction", dtype=torch.float64)
    x[0, 0, 0, :2] = 0.0  # ASUM's gradient is sign(x): 0 at 0
    x = x.requires_grad_(True)
    top = layer(x)
    top_diff = np.random.default_rng(1).standard_normal(top.shape)
    want_top, want_diff = ref_reduction(x.detach().numpy(), top_diff, op, axis, coeff)
    assert top.shape == want_top.shape == layer.output_shapes([shape])[0]
    np.testing.assert_allclose(top.detach().numpy(), want_top, rtol=1e-12)
    top.backward(torch.tensor(top_diff))
    np.testing.assert_allclose(x.grad.numpy(), want_diff, rtol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, kink=0.0, kink_range=0.02)


@pytest.mark.parametrize("axis", [4, -5])
def test_error_axis(axis):
    with pytest.raises(LayerParamError, match=r"layer 'r1' \(Reduction\).*axis"):
        make_layer(
            f"reduction_param {{ axis: {axis} }}", [(2, 3, 4, 5)], type="Reduction", name="r1"
        )


@pytest.mark.parametrize("op", ["MEAN", "SUMSQ"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_reduction_is_the_float_one_rounded(dtype, op):
    # the MEAN of 100000 tens is 10; a float16 running sum passes 65504 on the way
    x = (torch.randn(2, 100000, generator=torch.Generator().manual_seed(3)) + 10).to(dtype)
    snippet = f"reduction_param {{ operation: {op} axis: 1 coeff: 1e-5 }}"
    layer, _ = make_layer(snippet, [x.shape], type="Reduction", bottoms=[x], dtype=dtype)
    ref, _ = make_layer(snippet, [x.shape], type="Reduction", bottoms=[x.float()])
    y = layer(x)
    assert y.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(y.float(), ref(x.float()), rtol=tol, atol=0)
