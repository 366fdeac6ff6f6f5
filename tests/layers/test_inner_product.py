"""InnerProduct: y = x W^T + b over the axes from `axis` on; `transpose` stores W as (K, N)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

FILLERS = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 1 }'
CASES = [
    LayerCase(
        "InnerProduct",
        f"inner_product_param {{ num_output: 6 {FILLERS} }}",
        ((2, 3, 4, 5),),
        id="ip_default",
    ),
    LayerCase(
        "InnerProduct",
        f"inner_product_param {{ num_output: 6 axis: 2 {FILLERS} }}",
        ((2, 3, 4, 5),),
        id="ip_axis2",
    ),
    LayerCase(
        "InnerProduct",
        f"inner_product_param {{ num_output: 7 transpose: true bias_term: false {FILLERS} }}",
        ((3, 4, 5),),
        id="ip_transpose_nobias",
    ),
    LayerCase(
        "InnerProduct",
        f"inner_product_param {{ num_output: 2 axis: -1 {FILLERS} }}",
        ((2, 3, 4),),
        id="ip_axis_neg1",
    ),
]


def reference(x, w, b, axis, transpose):
    """Caffe's gemm: M = count(0, axis), K = count(axis); W is N x K (or K x N if transpose)."""
    m = int(np.prod(x.shape[:axis]))
    flat = x.reshape(m, -1)
    y = flat @ (w if transpose else w.T)
    if b is not None:
        y = y + b
    return y.reshape(x.shape[:axis] + (y.shape[-1],))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_matches_gemm_reference(case):
    layer, (x,) = case.build()
    p = layer.layer_param.inner_product_param
    axis = p.axis % x.dim()
    blobs = [t.detach().double().numpy() for t in layer.param_blobs()]
    b = blobs[1] if p.bias_term else None
    want = reference(x.double().numpy(), blobs[0], b, axis, p.transpose)
    np.testing.assert_allclose(layer(x).detach().numpy(), want, rtol=1e-5, atol=1e-5)


def test_blob_shapes_follow_transpose():
    layer, _ = make_layer(
        "inner_product_param { num_output: 7 transpose: true }", [(3, 4, 5)], type="InnerProduct"
    )
    assert [tuple(t.shape) for t in layer.param_blobs()] == [(20, 7), (7,)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer.double(), [b.double() for b in bottoms])


def test_num_output_must_be_positive():
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(InnerProduct\).*num_output"):
        make_layer("inner_product_param { num_output: 0 }", type="InnerProduct")


def test_axis_out_of_range():
    with pytest.raises(LayerParamError, match=r"\(InnerProduct\).*axis"):
        make_layer("inner_product_param { num_output: 2 axis: 4 }", type="InnerProduct")


def test_incompatible_input_size_on_reshape():
    layer, _ = make_layer("inner_product_param { num_output: 2 }", [(2, 3, 4)], type="InnerProduct")
    with pytest.raises(LayerParamError, match=r"\(InnerProduct\).*incompatible.*got 15"):
        layer.output_shapes([(2, 3, 5)])  # once per input shape, not inside forward


def test_a_two_axis_top_is_the_product_itself_not_a_view():
    """An in-place ReLU on a view of the product would make autograd copy it back in the
    backward (CopySlices): where the top has the product's shape, it is the product."""
    import torch

    layer, (x,) = make_layer(
        "inner_product_param { num_output: 4 }", [(3, 2, 5)], type="InnerProduct"
    )
    y = layer(x.requires_grad_())
    assert y._base is None
    torch.relu_(y)
    assert type(y.grad_fn).__name__ == "ReluBackward0"
