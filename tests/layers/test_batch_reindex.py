"""BatchReindex: gather by float indices (repeats accumulate in the gradient), Caffe's range
check on the float values, no gradient to the index bottom."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError, LayerParamError


def _data_and_index(shape, index):
    return lambda g: [
        torch.randn(shape, generator=g, dtype=torch.float64),
        torch.tensor(index, dtype=torch.float64),
    ]


CASES = [
    LayerCase(
        "BatchReindex",
        "",
        ((4, 3, 2), (6,)),
        make_bottoms=_data_and_index((4, 3, 2), [3, 0, 1, 3, 2, 3]),
    ),
    LayerCase("BatchReindex", "", ((5, 3), (2,)), make_bottoms=_data_and_index((5, 3), [4, 1])),
]


def ref_batch_reindex(x, index, top_diff):
    """Caffe: out[n] = in[int(index[n])]; backward adds top_diff[n] into item int(index[n])."""
    out = np.stack([x[int(i)] for i in index]) if len(index) else np.empty((0,) + x.shape[1:])
    diff = np.zeros_like(x)
    for n, i in enumerate(index):
        diff[int(i)] += top_diff[n]
    return out, diff


@pytest.mark.parametrize(
    "shape,index",
    [
        ((4, 3, 2), [3, 0, 1, 3, 2, 3]),
        ((5, 3), [4, 1]),
        ((3, 2, 4), [2.7, 0.2, 1.0]),  # truncated toward 0, as static_cast<int>
        ((3,), [1, 1, 1, 1]),
    ],
)
def test_forward_backward_match_caffe(shape, index):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor(index, dtype=torch.float64, requires_grad=True)
    layer, _ = make_layer(
        "",
        [shape, (len(index),)],
        type="BatchReindex",
        bottoms=[x.detach(), idx.detach()],
        dtype=torch.float64,
    )
    top = layer(x, idx)
    top_diff = np.random.default_rng(0).standard_normal(top.shape)
    want, want_diff = ref_batch_reindex(x.detach().numpy(), index, top_diff)
    assert layer.output_shapes([shape, (len(index),)]) == [want.shape]
    np.testing.assert_array_equal(top.detach().numpy(), want)
    top.backward(torch.tensor(top_diff))
    np.testing.assert_allclose(x.grad.numpy(), want_diff, rtol=1e-12)
    assert idx.grad is None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0])


def test_index_bottom_is_forced_and_refused():
    # Caffe's BatchReindex keeps Layer's AllowForceBackward (true); its Backward CHECK aborts
    # when asked for the index diff ("Cannot backprop to index.")
    layer, _ = CASES[0].build()
    assert layer.allow_force_backward(0) and layer.allow_force_backward(1)
    assert layer.backward_refusal([True, False], ["x", "i"]) is None
    assert layer.backward_refusal([True, True], ["x", "i"])


@pytest.mark.parametrize("index", [[0, 4], [-1, 0], [-0.5, 1], [float("nan")]])
def test_error_index_out_of_range(index):
    layer, _ = make_layer("", [(4, 3), (len(index),)], type="BatchReindex", name="b1")
    with pytest.raises(LayerParamError, match=r"layer 'b1' \(BatchReindex\).*index"):
        layer(torch.zeros(4, 3), torch.tensor(index))


def test_error_index_must_be_1d():
    with pytest.raises(LayerParamError, match=r"layer 'b1' \(BatchReindex\).*1-D"):
        make_layer("", [(4, 3), (2, 1)], type="BatchReindex", name="b1")


def test_error_needs_two_bottoms():
    with pytest.raises(BlobWiringError, match=r"layer 'b1' \(BatchReindex\).*bottom"):
        make_layer("", [(4, 3)], type="BatchReindex", name="b1")
