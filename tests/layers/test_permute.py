"""Permute (SSD fork): named orders first, the rest in order; backward scatters back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("Permute", "permute_param { order: 0 order: 2 order: 3 order: 1 }", id="nhwc"),
    LayerCase("Permute", "permute_param { order: 1 }", ((2, 3, 4),), id="partial_3d"),
    LayerCase("Permute", "", id="identity"),
]


def ref_permute(x, named):
    """The fork's index loop: top[i] = bottom[old_idx] with old steps of the full order."""
    order = list(named) + [a for a in range(x.ndim) if a not in named]
    top_shape = [x.shape[a] for a in order]
    old_steps = [int(np.prod(x.shape[a + 1 :])) for a in range(x.ndim)]
    new_steps = [int(np.prod(top_shape[a + 1 :])) for a in range(x.ndim)]
    flat = x.ravel()
    top = np.empty(x.size)
    for i in range(x.size):
        idx, old = i, 0
        for j in range(x.ndim):
            old += (idx // new_steps[j]) * old_steps[order[j]]
            idx %= new_steps[j]
        top[i] = flat[old]
    return top.reshape(top_shape)


@pytest.mark.parametrize(
    "shape,named",
    [
        ((2, 3, 4, 5), (0, 2, 3, 1)),
        ((2, 3, 4, 5), (0, 3)),
        ((3, 4, 5), (2,)),
        ((2, 3, 4, 5), ()),
        ((2, 1, 3, 2, 2), (4, 1)),
    ],
)
def test_forward_and_backward_match_the_forks_loops(shape, named):
    snippet = "permute_param { " + " ".join(f"order: {o}" for o in named) + " }"
    layer, (x,) = make_layer(snippet, [shape], type="Permute", dtype=torch.float64)
    x.requires_grad_(True)
    top = layer(x)
    want = ref_permute(x.detach().numpy(), named)
    np.testing.assert_array_equal(top.detach().numpy(), want)
    assert layer.output_shapes([shape]) == [want.shape]
    # Backward writes bottom_diff[old_idx] = top_diff[i]: the inverse permutation.
    top_diff = torch.randn(top.shape, dtype=torch.float64)
    top.backward(top_diff)
    index = ref_permute(np.arange(x.numel(), dtype=np.float64).reshape(shape), named).ravel()
    want_diff = np.empty(x.numel())
    want_diff[index.astype(int)] = top_diff.numpy().ravel()
    np.testing.assert_array_equal(x.grad.numpy().ravel(), want_diff)


def test_gradient():
    layer, bottoms = make_layer(
        "permute_param { order: 3 order: 1 }", [(2, 3, 2, 4)], type="Permute", dtype=torch.float64
    )
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,match",
    [
        ("permute_param { order: 4 }", "less than the bottom's number of axes"),
        ("permute_param { order: 1 order: 1 }", "duplicate orders"),
    ],
)
def test_errors(snippet, match):
    with pytest.raises(LayerParamError, match=rf"layer 'p' \(Permute\).*{match}"):
        make_layer(snippet, [(2, 3, 4, 5)], type="Permute", name="p")
