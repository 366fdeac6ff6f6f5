"""Silence: no tops, any number of bottoms; they get zero gradient from it."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError

CASES = [
    LayerCase("Silence", "", ((2, 3, 4),), n_tops=0),
    LayerCase("Silence", "", ((2, 3, 4), (5,)), n_tops=0),
]


def test_forward_produces_no_tops():
    layer, bottoms = make_layer("", [(2, 3, 4), (5,)], type="Silence", n_tops=0)
    assert layer(*bottoms) == ()
    assert layer.output_shapes([(2, 3, 4), (5,)]) == []


def test_backward_gives_zero_gradient():
    """Caffe's Backward_cpu zeroes the bottom diffs: other consumers' gradients are all."""
    layer, (x,) = make_layer("", [(2, 3, 4)], type="Silence", n_tops=0, dtype=torch.float64)
    x = x.requires_grad_(True)
    assert layer(x) == ()
    (x * 3).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 3.0))


def test_error_no_tops_allowed():
    with pytest.raises(BlobWiringError, match=r"layer 's1' \(Silence\).*top"):
        make_layer("", [(2, 3)], type="Silence", n_tops=1, name="s1")


def test_error_needs_a_bottom():
    with pytest.raises(BlobWiringError, match=r"layer 's1' \(Silence\).*bottom"):
        make_layer("", [], type="Silence", n_tops=0, name="s1")
