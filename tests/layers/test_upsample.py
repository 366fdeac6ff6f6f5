"""Upsample: brocolli's nearest form (1 bottom, no backward) and SegNet's unpooling (2 bottoms)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import layer_param, make_layer
from tests.layers.test_max_unpool import ref_unpool, unique_mask
from torchcaffe.errors import BlobWiringError, LayerParamError
from torchcaffe.registry import layer_class


def _segnet_bottoms(shape, size):
    def make(gen):
        return [torch.randn(shape, generator=gen), unique_mask(shape, size, gen)]

    return make


CASES = [
    LayerCase("Upsample", "upsample_param { scale: 2 }", ((2, 3, 3, 4),)),
    LayerCase("Upsample", "upsample_param { scale: 3 dims_num: 3 }", ((2, 3, 5),)),
    LayerCase(
        "Upsample",
        "upsample_param { scale: 2 }",
        ((2, 3, 3, 4),) * 2,
        make_bottoms=_segnet_bottoms((2, 3, 3, 4), 48),
    ),
    LayerCase(
        "Upsample",
        "upsample_param { upsample_h: 5 upsample_w: 7 }",
        ((1, 2, 3, 4),) * 2,
        make_bottoms=_segnet_bottoms((1, 2, 3, 4), 35),
    ),
]


def ref_nearest(x, scale, dims_num):
    """brocolli's loop: top index (h, w) reads bottom (h / scale, w / scale)."""
    out_shape = (
        x.shape[:-2] + (x.shape[-2] * scale, x.shape[-1] * scale)
        if dims_num == 4
        else x.shape[:-1] + (x.shape[-1] * scale,)
    )
    out = np.empty(out_shape, dtype=x.dtype)
    for idx in np.ndindex(*out_shape):
        src = (
            idx[:-2] + (idx[-2] // scale, idx[-1] // scale)
            if dims_num == 4
            else idx[:-1] + (idx[-1] // scale,)
        )
        out[idx] = x[src]
    return out


def ref_segnet_backward(top_diff, mask):
    """SegNet's Backward_cpu: bottom_diff[i] = top_diff[mask[i]] per (n, c)."""
    n, c = mask.shape[:2]
    flat = top_diff.reshape(n, c, -1)
    return np.stack([[flat[a, b][mask[a, b].astype(np.int64)] for b in range(c)] for a in range(n)])


@pytest.mark.parametrize(
    "snippet,shape,scale,dims",
    [
        ("upsample_param { scale: 2 }", (2, 3, 3, 4), 2, 4),
        ("upsample_param { scale: 3 dims_num: 3 }", (2, 3, 5), 3, 3),
        ("", (2, 3, 2, 4), 1, 4),  # brocolli's default scale 1: a copy
    ],
)
def test_nearest_forward_matches_reference(snippet, shape, scale, dims):
    layer, (x,) = make_layer(snippet, [shape], type="Upsample")
    top = layer(x.requires_grad_(True))
    want = ref_nearest(x.detach().numpy(), scale, dims)
    np.testing.assert_array_equal(top.detach().numpy(), want)
    assert layer.output_shapes([shape]) == [want.shape]
    assert not layer.has_backward and not top.requires_grad


@pytest.mark.parametrize(
    "snippet,kernel,in_hw,out_hw",
    [
        ("upsample_param { scale: 2 }", 2, (6, 8), (6, 8)),
        ("", 2, (6, 8), (6, 8)),  # SegNet's default scale 2
        ("upsample_param { scale_h: 2 scale_w: 3 }", 0, (6, 9), (6, 9)),
        ("upsample_param { scale: 2 pad_out_h: true }", 2, (5, 8), (5, 8)),  # ceil pooling, H odd
        ("upsample_param { upsample_h: 7 upsample_w: 9 }", 2, (7, 9), (7, 9)),
        ("upsample_param { upsample_h: 7 upsample_w: 9 }", 3, (7, 9), (7, 9)),  # shared indices
    ],
)
def test_segnet_forward_backward_after_pooling(snippet, kernel, in_hw, out_hw):
    x = torch.randn(2, 3, *in_hw, generator=torch.Generator().manual_seed(0))
    pooling = (
        "kernel_h: 2 kernel_w: 3 stride_h: 2 stride_w: 3"
        if kernel == 0
        else f"kernel_size: {kernel} stride: 2"
    )
    pool = layer_class("Pooling").from_param(
        layer_param(f"pooling_param {{ pool: MAX {pooling} }}", type="Pooling", n_tops=2), [x.shape]
    )
    p, mask = pool(x)
    layer, _ = make_layer(snippet, [p.shape, mask.shape], type="Upsample")
    p = p.detach().requires_grad_(True)
    top = layer(p, mask)
    want = ref_unpool(p.detach().numpy(), mask.numpy(), out_hw)
    np.testing.assert_array_equal(top.detach().numpy(), want)
    assert layer.output_shapes([p.shape, mask.shape]) == [want.shape]
    top_diff = np.random.default_rng(0).standard_normal(want.shape).astype(np.float32)
    top.backward(torch.from_numpy(top_diff))
    np.testing.assert_array_equal(p.grad.numpy(), ref_segnet_backward(top_diff, mask.numpy()))


def test_segnet_output_size_fixed_at_setup():
    layer, (x, mask) = CASES[2].build()
    assert layer.output_shapes([(2, 3, 5, 5)] * 2) == [(2, 3, 6, 8)]


@pytest.mark.parametrize("case", CASES[2:], ids=lambda c: c.name)
def test_segnet_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0])


@pytest.mark.parametrize("bad", [48.0, -1.0])
def test_error_index_out_of_range(bad):
    layer, (x, mask) = CASES[2].build()
    mask[1, 2, 0, 0] = bad
    with pytest.raises(LayerParamError, match=r"\(Upsample\).*out of range.*0 <= index < 48"):
        layer(x, mask)


_SEG = [(2, 3, 3, 4)] * 2
_ONE = [(2, 3, 3, 4)]


@pytest.mark.parametrize(
    "snippet,shapes,field",
    [
        ("upsample_param { dims_num: 5 }", _ONE, "dims_num must be 3 or 4"),
        ("upsample_param { scale: 0 }", _ONE, "scale must be positive"),
        ("upsample_param { scale: 2 dims_num: 3 }", _ONE, "3-D input"),
        ("upsample_param { scale: 2 }", [(2, 3, 4)], "4-D input"),
        ("upsample_param { upsample_h: 6 upsample_w: 8 }", _ONE, "mask as bottom 1"),
        ("upsample_param { scale: 2 dims_num: 4 }", _SEG, "dims_num"),
        ("upsample_param { scale: 2 scale_h: 2 scale_w: 2 }", _SEG, "upsample_h & upsample_w"),
        ("upsample_param { scale_h: 2 }", _SEG, "upsample_h & upsample_w"),
        ("upsample_param { scale: 1 }", _SEG, "greater than 1"),
        ("upsample_param { upsample_h: 1 upsample_w: 8 }", _SEG, "greater than 1"),
        ("upsample_param { scale: 3 pad_out_w: true }", _SEG, "pad_out_w requires scale_w == 2"),
        ("upsample_param { scale: 2 }", [(2, 3, 3, 4), (2, 3, 4, 3)], "mask"),
        ("upsample_param { scale: 2 }", [(3, 4), (3, 4)], "4 axes"),
    ],
)
def test_error(snippet, shapes, field):
    with pytest.raises(LayerParamError, match=rf"layer 'u1' \(Upsample\).*{field}"):
        make_layer(snippet, shapes, type="Upsample", name="u1")


def test_error_three_bottoms():
    with pytest.raises(BlobWiringError, match=r"layer 'u1' \(Upsample\).*1 to 2 bottom"):
        make_layer("", [(2, 3, 3, 4)] * 3, type="Upsample", name="u1")
