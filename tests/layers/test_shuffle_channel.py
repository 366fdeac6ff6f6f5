"""ShuffleChannel: channel j*G + i of the top is channel i*(C/G) + j of the bottom."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("ShuffleChannel", "shuffle_channel_param { group: 2 }", ((2, 6, 3, 4),), id="group2"),
    LayerCase("ShuffleChannel", "shuffle_channel_param { group: 3 }", ((2, 6, 5),), id="3d"),
    LayerCase("ShuffleChannel", "", id="group1_identity"),
]


def ref_shuffle(x, group):
    """The fork's copy loop over (group row i, group column j) blocks of H*W values."""
    columns = x.shape[1] // group
    top = np.empty_like(x)
    for i in range(group):
        for j in range(columns):
            top[:, j * group + i] = x[:, i * columns + j]
    return top


@pytest.mark.parametrize(
    "shape,group",
    [
        ((2, 6, 3, 4), 2),
        ((2, 6, 3, 4), 3),
        ((1, 12, 2, 2), 4),
        ((2, 6, 5), 6),
        ((3, 4), 2),
        ((2, 5, 2, 2), 1),
    ],
)
def test_forward_and_inverse_backward(shape, group):
    layer, (x,) = make_layer(
        f"shuffle_channel_param {{ group: {group} }}",
        [shape],
        type="ShuffleChannel",
        dtype=torch.float64,
    )
    x.requires_grad_(True)
    top = layer(x)
    np.testing.assert_array_equal(top.detach().numpy(), ref_shuffle(x.detach().numpy(), group))
    top_diff = torch.randn(top.shape, dtype=torch.float64)
    top.backward(top_diff)
    # Each bottom channel receives the diff of the top channel it was copied to.
    back = np.empty(shape)
    columns = shape[1] // group
    for i in range(group):
        for j in range(columns):
            back[:, i * columns + j] = top_diff.numpy()[:, j * group + i]
    np.testing.assert_array_equal(x.grad.numpy(), back)


def test_gradient():
    layer, bottoms = make_layer(
        "shuffle_channel_param { group: 3 }",
        [(2, 6, 2, 3)],
        type="ShuffleChannel",
        dtype=torch.float64,
    )
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,shape,match",
    [
        ("shuffle_channel_param { group: 0 }", (2, 6, 3, 3), "group must be greater than 0"),
        ("shuffle_channel_param { group: 4 }", (2, 6, 3, 3), "divisible by group"),
        ("shuffle_channel_param { group: 2 }", (6,), "channel axis"),
    ],
)
def test_errors(snippet, shape, match):
    with pytest.raises(LayerParamError, match=rf"layer 's' \(ShuffleChannel\).*{match}"):
        make_layer(snippet, [shape], type="ShuffleChannel", name="s")
