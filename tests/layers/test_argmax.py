"""ArgMax: top_k, out_max_val, with and without axis, Caffe's top shapes, Caffe's tie order
(pairs (value, index) sorted with std::greater: the larger index first), no backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import DataError, LayerParamError

CASES = [
    LayerCase("ArgMax", "", ((3, 2, 4, 5),)),
    LayerCase("ArgMax", "argmax_param { axis: 1 top_k: 2 }", ((2, 5, 3, 4),)),
    LayerCase("ArgMax", "argmax_param { axis: 2 out_max_val: true }", ((2, 3, 6),)),
    LayerCase("ArgMax", "argmax_param { top_k: 2 out_max_val: true }", ((3, 7),)),
]


def _caffe_top_k(row, k):
    """std::partial_sort of (value, index) pairs with std::greater: the first k pairs."""
    pairs = sorted(((float(v), j) for j, v in enumerate(row)), reverse=True)
    return pairs[:k]


def ref_argmax(x, top_k, out_max_val, axis):
    if axis is None:
        rows = x.reshape(x.shape[0], -1)
        out = np.ones((x.shape[0], 2 if out_max_val else 1, top_k) + (1,) * max(0, x.ndim - 3))
        for i, row in enumerate(rows):
            pairs = _caffe_top_k(row, top_k)
            out[i, 0, :, ...] = np.array([j for _, j in pairs]).reshape(
                (top_k,) + (1,) * max(0, x.ndim - 3)
            )
            if out_max_val:
                out[i, 1, :, ...] = np.array([v for v, _ in pairs]).reshape(
                    (top_k,) + (1,) * max(0, x.ndim - 3)
                )
        return out
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape[:-1] + (top_k,))
    for idx in np.ndindex(moved.shape[:-1]):
        pairs = _caffe_top_k(moved[idx], top_k)
        out[idx] = [v if out_max_val else j for v, j in pairs]
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize(
    "shape,top_k,out_max_val,axis",
    [
        ((3, 2, 4, 5), 1, False, None),
        ((3, 2, 4, 5), 3, True, None),
        ((3, 7), 2, True, None),
        ((4, 6), 1, False, None),
        ((2, 5, 3, 4), 2, False, 1),
        ((2, 3, 6), 1, True, 2),
        ((2, 3, 6), 4, False, -1),
        ((5, 3), 2, True, 0),
        ((2, 5, 3, 4), 5, True, 1),
    ],
)
@pytest.mark.parametrize("ties", [False, True])
def test_forward_matches_reference(shape, top_k, out_max_val, axis, ties):
    params = f"top_k: {top_k} out_max_val: {str(out_max_val).lower()}"
    if axis is not None:
        params += f" axis: {axis}"
    gen = torch.Generator().manual_seed(7)
    x = (
        torch.randint(0, 3, shape, generator=gen).double()
        if ties
        else torch.randn(shape, generator=gen, dtype=torch.float64)
    )
    layer, _ = make_layer(
        f"argmax_param {{ {params} }}", [shape], type="ArgMax", bottoms=[x], dtype=torch.float64
    )
    want = ref_argmax(x.numpy(), top_k, out_max_val, axis)
    top = layer(x)
    assert layer.output_shapes([shape]) == [want.shape]
    np.testing.assert_array_equal(top.numpy(), want)


def test_no_gradient():
    layer, (x,) = make_layer("", [(3, 4)], type="ArgMax", dtype=torch.float64)
    assert not layer.has_backward
    top = layer(x.requires_grad_(True))
    assert not top.requires_grad


@pytest.mark.parametrize(
    "snippet,shape,field",
    [
        ("argmax_param { top_k: 0 }", (3, 4), "top_k"),
        ("argmax_param { top_k: 5 }", (3, 2, 2), "top_k"),
        ("argmax_param { axis: 1 top_k: 3 }", (3, 2, 2), "top_k"),
        ("argmax_param { axis: 3 }", (3, 2, 2), "axis"),
    ],
)
def test_error(snippet, shape, field):
    with pytest.raises(LayerParamError, match=rf"layer 'a1' \(ArgMax\).*{field}"):
        make_layer(snippet, [shape], type="ArgMax", name="a1")


@pytest.mark.parametrize("snippet", ["", "argmax_param { axis: 1 }"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_index_the_dtype_cannot_hold_is_an_error(dtype, snippet):
    """In a .bfloat16() net class 999 of 1000 would read 1000; Caffe's float holds it."""
    x = torch.zeros(2, 3000, dtype=dtype)
    x[0, 255] = x[1, 3] = 1
    layer, _ = make_layer(snippet, [x.shape], type="ArgMax", bottoms=[x], dtype=dtype)
    assert layer(x).float().reshape(-1).tolist() == [255, 3]
    x[0, 2049] = 2
    with pytest.raises(DataError, match=f"index 2049 cannot be represented in {dtype}"):
        layer(x)
