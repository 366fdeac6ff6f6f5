"""MaxUnPool (brocolli): values back at their mask index, the later write wins, no backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import layer_param, make_layer
from torchcaffe.errors import BlobWiringError, LayerParamError
from torchcaffe.registry import layer_class


def unique_mask(shape, size, gen):
    """Distinct flat indices in [0, size) per (n, c), as floats (a Pooling mask top)."""
    n, c, h, w = shape
    rows = [torch.randperm(size, generator=gen)[: h * w] for _ in range(n * c)]
    return torch.stack(rows).reshape(shape).to(torch.float32)


def _bottoms(shape, size):
    def make(gen):
        return [torch.randn(shape, generator=gen), unique_mask(shape, size, gen)]

    return make


CASES = [
    LayerCase(
        "MaxUnPool",
        "max_unpool_param { dst_h: 6 dst_w: 8 }",
        ((2, 3, 3, 4),) * 2,
        make_bottoms=_bottoms((2, 3, 3, 4), 48),
    ),
    LayerCase(
        "MaxUnPool",
        "max_unpool_param { dst_h: 5 dst_w: 7 }",
        ((1, 2, 3, 3),) * 2,
        make_bottoms=_bottoms((1, 2, 3, 3), 35),
    ),
]


def ref_unpool(x, mask, dst_hw):
    """The fork's loop: zero the top, then top[mask[i]] = x[i] for i in order."""
    n, c = x.shape[:2]
    out = np.zeros((n, c, dst_hw[0] * dst_hw[1]), dtype=x.dtype)
    for a in range(n):
        for b in range(c):
            for v, m in zip(x[a, b].ravel(), mask[a, b].ravel()):
                out[a, b, int(m)] = v
    return out.reshape(n, c, *dst_hw)


def test_forward_after_max_pooling():
    x = torch.randn(2, 3, 6, 8, generator=torch.Generator().manual_seed(0))
    pool = layer_class("Pooling").from_param(
        layer_param(
            "pooling_param { pool: MAX kernel_size: 2 stride: 2 }", type="Pooling", n_tops=2
        ),
        [(2, 3, 6, 8)],
    )
    p, mask = pool(x)
    layer, _ = make_layer(
        "max_unpool_param { dst_h: 6 dst_w: 8 }", [p.shape, mask.shape], type="MaxUnPool"
    )
    top = layer(p, mask)
    np.testing.assert_array_equal(top.numpy(), ref_unpool(p.numpy(), mask.numpy(), (6, 8)))
    assert layer.output_shapes([p.shape, mask.shape]) == [(2, 3, 6, 8)]


def test_shared_index_last_write_wins():
    x = torch.arange(1.0, 7.0).reshape(1, 1, 2, 3)
    mask = torch.tensor([[[[4.0, 0.0, 4.0], [2.9, 4.0, 1.0]]]])  # 2.9 truncates to 2
    layer, _ = make_layer(
        "max_unpool_param { dst_h: 2 dst_w: 3 }", [(1, 1, 2, 3)] * 2, type="MaxUnPool"
    )
    top = layer(x, mask)
    np.testing.assert_array_equal(top.numpy(), ref_unpool(x.numpy(), mask.numpy(), (2, 3)))
    assert top.flatten().tolist() == [2.0, 6.0, 4.0, 0.0, 5.0, 0.0]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_matches_reference(case):
    layer, (x, mask) = case.build()
    top = layer(x, mask)
    dst = (layer.param.dst_h, layer.param.dst_w)
    np.testing.assert_array_equal(top.numpy(), ref_unpool(x.numpy(), mask.numpy(), dst))


def test_no_backward():
    layer, (x, mask) = CASES[0].build()
    assert not layer.has_backward
    assert not layer(x.requires_grad_(True), mask).requires_grad


@pytest.mark.parametrize("bad", [48.0, -1.0])
def test_error_index_out_of_range(bad):
    layer, (x, mask) = CASES[0].build()
    mask[0, 0, 0, 0] = bad
    with pytest.raises(LayerParamError, match=r"\(MaxUnPool\).*out of range.*dst_h \* dst_w"):
        layer(x, mask)


@pytest.mark.parametrize(
    "snippet,shapes,field",
    [
        ("", [(2, 3, 3, 4)] * 2, "dst_h and dst_w are required"),
        ("max_unpool_param { dst_h: 6 }", [(2, 3, 3, 4)] * 2, "dst_w missing"),
        ("max_unpool_param { dst_h: 0 dst_w: 8 }", [(2, 3, 3, 4)] * 2, "positive"),
        ("max_unpool_param { dst_h: 6 dst_w: 8 }", [(2, 3, 3), (2, 3, 3)], "4 axes"),
        ("max_unpool_param { dst_h: 6 dst_w: 8 }", [(2, 3, 3, 4), (2, 3, 4, 3)], "mask"),
    ],
)
def test_error(snippet, shapes, field):
    with pytest.raises(LayerParamError, match=rf"layer 'u1' \(MaxUnPool\).*{field}"):
        make_layer(snippet, shapes, type="MaxUnPool", name="u1")


def test_error_one_bottom():
    with pytest.raises(BlobWiringError, match=r"layer 'u1' \(MaxUnPool\).*exactly 2"):
        make_layer(
            "max_unpool_param { dst_h: 6 dst_w: 8 }", [(2, 3, 3, 4)], type="MaxUnPool", name="u1"
        )
