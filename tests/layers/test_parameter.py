"""Parameter: one zero-initialized blob of the given shape; the top is that blob (its data,
and its gradient is the top's)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError

CASES = [
    LayerCase("Parameter", "parameter_param { shape { dim: 2 dim: 3 dim: 4 } }", ()),
    LayerCase("Parameter", "parameter_param { shape { dim: 5 } }", ()),
]


def test_forward_is_the_blob():
    layer, _ = make_layer(
        "parameter_param { shape { dim: 2 dim: 3 dim: 4 } }",
        [],
        type="Parameter",
        dtype=torch.float64,
    )
    (blob,) = layer.param_blobs()
    assert blob.shape == (2, 3, 4) and torch.equal(blob, torch.zeros(2, 3, 4, dtype=torch.float64))
    assert layer.output_shapes([]) == [(2, 3, 4)]
    with torch.no_grad():
        blob.copy_(torch.arange(24, dtype=torch.float64).reshape(2, 3, 4))
    top = layer()
    assert torch.equal(top, blob)
    top_diff = torch.randn(2, 3, 4, dtype=torch.float64)
    top.backward(top_diff)
    assert torch.equal(blob.grad, top_diff)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    with torch.no_grad():
        layer.param_blobs()[0].normal_()
    check_layer_gradient(layer, bottoms)


def test_error_takes_no_bottoms():
    with pytest.raises(BlobWiringError, match=r"layer 'p1' \(Parameter\).*bottom"):
        make_layer("parameter_param { shape { dim: 2 } }", [(2,)], type="Parameter", name="p1")
