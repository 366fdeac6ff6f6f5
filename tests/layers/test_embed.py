"""Embed: lookup by float indices (truncated), weight (input_dim, num_output), optional bias,
fillers, gradients to the params (repeats accumulate) and none to the indices; out-of-range
indices and bad sizes are errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

FILL = "weight_filler { type: 'gaussian' } bias_filler { type: 'uniform' }"


def _indices(shape, high):
    return lambda g: [torch.randint(0, high, shape, generator=g).double()]


CASES = [
    LayerCase(
        "Embed",
        f"embed_param {{ input_dim: 7 num_output: 5 {FILL} }}",
        ((3, 4),),
        make_bottoms=_indices((3, 4), 7),
    ),
    LayerCase(
        "Embed",
        "embed_param { input_dim: 5 num_output: 4 bias_term: false "
        "weight_filler { type: 'gaussian' } }",
        ((8,),),
        make_bottoms=_indices((8,), 5),
    ),
]


def ref_embed(index, weight, bias, top_diff):
    """Caffe: top[n] = weight[int(index[n])] (+ bias); weight_diff[int(index[n])] +=
    top_diff[n]; bias_diff = sum over n of top_diff[n]."""
    flat = [int(i) for i in index.reshape(-1)]
    top = np.stack([weight[i] for i in flat]).reshape(index.shape + (weight.shape[1],))
    if bias is not None:
        top = top + bias
    weight_diff = np.zeros_like(weight)
    for n, i in enumerate(flat):
        weight_diff[i] += top_diff.reshape(len(flat), -1)[n]
    bias_diff = top_diff.reshape(len(flat), -1).sum(0)
    return top, weight_diff, bias_diff


@pytest.mark.parametrize("bias_term", [True, False])
@pytest.mark.parametrize(
    "index",
    [
        np.array([[0.0, 6, 3, 3], [2, 2, 2, 5], [1, 0, 6, 4]]),
        np.array([4.0, 0, 1.9, 0.5, 3]),  # truncated toward 0
    ],
)
def test_forward_backward_match_caffe(bias_term, index):
    snippet = (
        f"embed_param {{ input_dim: 7 num_output: 5 bias_term: {str(bias_term).lower()} {FILL} }}"
    )
    idx = torch.tensor(index, requires_grad=True)
    layer, _ = make_layer(
        snippet, [index.shape], type="Embed", bottoms=[idx.detach()], dtype=torch.float64
    )
    blobs = layer.param_blobs()
    assert [tuple(b.shape) for b in blobs] == [(7, 5)] + ([(5,)] if bias_term else [])
    top = layer(idx)
    assert layer.output_shapes([index.shape]) == [tuple(top.shape)]
    top_diff = np.random.default_rng(0).standard_normal(top.shape)
    bias = blobs[1].detach().numpy() if bias_term else None
    want, want_wdiff, want_bdiff = ref_embed(index, blobs[0].detach().numpy(), bias, top_diff)
    np.testing.assert_allclose(top.detach().numpy(), want, rtol=1e-12)
    top.backward(torch.tensor(top_diff))
    np.testing.assert_allclose(blobs[0].grad.numpy(), want_wdiff, rtol=1e-12)
    if bias_term:
        np.testing.assert_allclose(blobs[1].grad.numpy(), want_bdiff, rtol=1e-12)
    # Caffe's Embed forces its input under force_backward, then its Backward CHECK aborts
    assert idx.grad is None and layer.allow_force_backward(0)
    assert layer.backward_refusal([True], ["idx"])


def test_fillers_default_to_zero():
    layer, _ = make_layer("embed_param { input_dim: 3 num_output: 2 }", [(4,)], type="Embed")
    assert all(torch.equal(b, torch.zeros_like(b)) for b in layer.param_blobs())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, check=("params",))


@pytest.mark.parametrize(
    "snippet,field",
    [
        ("embed_param { input_dim: 3 }", "num_output"),
        ("embed_param { num_output: 3 }", "input_dim"),
        ("embed_param { input_dim: 3 num_output: 2 weight_filler { type: 'nope' } }", "nope"),
    ],
)
def test_error(snippet, field):
    with pytest.raises(LayerParamError, match=rf"layer 'e1' \(Embed\).*{field}"):
        make_layer(snippet, [(4,)], type="Embed", name="e1")


@pytest.mark.parametrize("index", [[0.0, 3.0], [-1.0, 0.0], [3.5]])
def test_error_index_out_of_range(index):
    layer, _ = make_layer(
        "embed_param { input_dim: 3 num_output: 2 }", [(len(index),)], type="Embed", name="e1"
    )
    with pytest.raises(LayerParamError, match=r"layer 'e1' \(Embed\).*index"):
        layer(torch.tensor(index))
