"""PSROIPooling against a numpy port of R-FCN's psroi_pooling_layer.cu (daijifeng001/caffe-rfcn,
as in brocolli-caffe 9.0.2; the fork has no CPU forward): position-sensitive channel map,
C rounding before scaling, end + 1, 0.1 minimum size, fused bin edges, clipping, averages,
empty bins, and the backward that spreads diff / bin_area over each bin."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

# [n x1 y1 x2 y2] in image pixels: ordinary, halves (C rounds 2.5 -> 3, -0.5 -> -1), inverted
# (-> 0.1 wide), partly and wholly outside the map, a negative start (the fused edges matter).
ROIS = [
    [0, 8, 4, 60, 50],
    [1, 2.5, -0.5, 30.4, 20.6],
    [1, 40, 40, 10, 10],
    [0, -30, -20, 100, 90],
    [1, 150, 160, 200, 210],
    [0, -40, -40, 0, 20],
]


def make_bottoms(gen, shape=(2, 2 * 9, 7, 9)):
    return [
        torch.randn(shape, generator=gen, dtype=torch.float64),
        torch.tensor(ROIS, dtype=torch.float64),
    ]


CASES = [
    LayerCase(
        "PSROIPooling",
        "psroi_pooling_param { spatial_scale: 0.125 output_dim: 2 group_size: 3 }",
        [(2, 18, 7, 9), (6, 5)],
        make_bottoms=make_bottoms,
    ),
    LayerCase(
        "PSROIPooling",
        "psroi_pooling_param { spatial_scale: 0.25 output_dim: 4 group_size: 1 }",
        [(2, 4, 7, 9), (6, 5)],
        make_bottoms=lambda gen: make_bottoms(gen, (2, 4, 7, 9)),
    ),
]


def c_round(v):
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def fma32(a, b, c):
    """a * b + c rounded once to float32 (the float32 product is exact in float64)."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


def ref_psroi_pool(x, rois, scale, dim, group):
    """PSROIPoolingForward per output element in float32 -> (top, bin windows per element)."""
    f = np.float32
    x, rois = x.astype(f), rois.astype(f)
    _, _, h, w = x.shape
    top = np.zeros((len(rois), dim, group, group), f)
    windows = {}
    for n, ctop, ph, pw in np.ndindex(*top.shape):
        roi = rois[n]
        sw, sh = f(c_round(roi[1])) * f(scale), f(c_round(roi[2])) * f(scale)
        ew, eh = f(c_round(roi[3]) + 1.0) * f(scale), f(c_round(roi[4]) + 1.0) * f(scale)
        bin_h = f(max(eh - sh, 0.1)) / f(group)
        bin_w = f(max(ew - sw, 0.1)) / f(group)
        hs = min(max(int(np.floor(fma32(ph, bin_h, sh))), 0), h)
        ws = min(max(int(np.floor(fma32(pw, bin_w, sw))), 0), w)
        he = min(max(int(np.ceil(fma32(ph + 1, bin_h, sh))), 0), h)
        we = min(max(int(np.ceil(fma32(pw + 1, bin_w, sw))), 0), w)
        c = (ctop * group + ph) * group + pw
        windows[n, ctop, ph, pw] = (int(roi[0]), c, hs, he, ws, we)
        if he > hs and we > ws:
            top[n, ctop, ph, pw] = x[int(roi[0]), c, hs:he, ws:we].sum() / f((he - hs) * (we - ws))
    return top, windows


def ref_backward(top_diff, windows, shape):
    """PSROIPoolingBackwardAtomic: each top diff / bin_area added over its bin."""
    diff = np.zeros(shape)
    for key, (b, c, hs, he, ws, we) in windows.items():
        if he > hs and we > ws:
            diff[b, c, hs:he, ws:we] += top_diff[key] / ((he - hs) * (we - ws))
    return diff


@pytest.mark.parametrize(
    "scale,dim,group,shape",
    [
        (0.125, 2, 3, (2, 18, 7, 9)),
        (0.0625, 3, 2, (2, 12, 5, 11)),
        (1.0, 1, 7, (2, 49, 30, 34)),
        (0.25, 4, 1, (2, 4, 13, 6)),
    ],
)
def test_forward_backward_match_reference(scale, dim, group, shape):
    snippet = (
        f"psroi_pooling_param {{ spatial_scale: {scale} output_dim: {dim} group_size: {group} }}"
    )
    x = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    rois = torch.tensor(ROIS, dtype=torch.float32)
    layer, _ = make_layer(snippet, [shape, rois.shape], type="PSROIPooling", bottoms=[x, rois])
    x.requires_grad_(True)
    top = layer(x, rois)
    want, windows = ref_psroi_pool(x.detach().numpy(), rois.numpy(), scale, dim, group)
    assert layer.output_shapes([shape, (6, 5)]) == [want.shape]
    np.testing.assert_allclose(top.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    top_diff = np.random.default_rng(1).standard_normal(want.shape).astype(np.float32)
    top.backward(torch.from_numpy(top_diff))
    np.testing.assert_allclose(
        x.grad.numpy(), ref_backward(top_diff, windows, shape), rtol=1e-5, atol=1e-6
    )


def test_channel_map_average_and_empty_bins():
    """Output (d, i, j) averages channel (d * g + i) * g + j over bin (i, j); the ROI wholly
    outside the map has only empty bins: 0, and no gradient."""
    x = torch.arange(8 * 4 * 4, dtype=torch.float32).reshape(1, 8, 4, 4)
    rois = torch.tensor([[0, 0, 0, 3, 3], [0, 10, 10, 20, 20]], dtype=torch.float32)
    layer, _ = make_layer(
        "psroi_pooling_param { spatial_scale: 1 output_dim: 2 group_size: 2 }",
        [(1, 8, 4, 4), (2, 5)],
        type="PSROIPooling",
        bottoms=[x, rois],
    )
    x.requires_grad_(True)
    top = layer(x, rois)
    for d, i, j in np.ndindex(2, 2, 2):
        c = (d * 2 + i) * 2 + j
        want = x[0, c, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2].mean()
        assert top[0, d, i, j] == want
    assert not top[1].any()
    top[1].sum().backward()
    assert not x.grad.any()


def test_fused_bin_edges_on_a_negative_start():
    """x1 = -40, x2 = 0, group 3: 3 * (41 / 3) - 40 is 1.000001 fused (ceil 2), 1.0 unfused."""
    x = torch.randn(1, 9, 3, 5, generator=torch.Generator().manual_seed(2))
    rois = torch.tensor([[0, -40, 0, 0, 2]], dtype=torch.float32)
    layer, _ = make_layer(
        "psroi_pooling_param { spatial_scale: 1 output_dim: 1 group_size: 3 }",
        [(1, 9, 3, 5), (1, 5)],
        type="PSROIPooling",
        bottoms=[x, rois],
    )
    top = layer(x, rois)
    assert torch.allclose(top[0, 0, :, 2], x[0, [2, 5, 8], [0, 1, 2], 0:2].mean(-1))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0])


def test_rois_get_no_gradient():
    layer, (x, rois) = CASES[0].build()
    x.requires_grad_(True)
    rois.requires_grad_(True)
    layer(x, rois).sum().backward()
    assert rois.grad is None and x.grad.any()


@pytest.mark.parametrize(
    "snippet,shapes,match",
    [
        (
            "psroi_pooling_param { output_dim: 2 group_size: 2 }",
            [(1, 8, 4, 4), (3, 5)],
            "spatial_scale is required",
        ),
        (
            "psroi_pooling_param { spatial_scale: 1 group_size: 2 }",
            [(1, 8, 4, 4), (3, 5)],
            "output_dim is required",
        ),
        (
            "psroi_pooling_param { spatial_scale: 1 output_dim: 2 }",
            [(1, 8, 4, 4), (3, 5)],
            "group_size is required",
        ),
        (
            "psroi_pooling_param { spatial_scale: 1 output_dim: 0 group_size: 2 }",
            [(1, 8, 4, 4), (3, 5)],
            "output_dim must be > 0",
        ),
        (
            "psroi_pooling_param { spatial_scale: 1 output_dim: 2 group_size: -1 }",
            [(1, 8, 4, 4), (3, 5)],
            "group_size must be > 0",
        ),
        (
            "psroi_pooling_param { spatial_scale: 1 output_dim: 2 group_size: 2 }",
            [(1, 9, 4, 4), (3, 5)],
            "input channel number does not match.*got 9",
        ),
        (
            "psroi_pooling_param { spatial_scale: 1 output_dim: 2 group_size: 2 }",
            [(1, 8, 4, 4), (3, 4)],
            "R x 5",
        ),
    ],
)
def test_error(snippet, shapes, match):
    with pytest.raises(LayerParamError, match=rf"layer 'p1' \(PSROIPooling\).*{match}"):
        make_layer(snippet, shapes, type="PSROIPooling", name="p1")


def test_error_batch_index_out_of_range():
    layer, _ = make_layer(
        "psroi_pooling_param { spatial_scale: 1 output_dim: 2 group_size: 2 }",
        [(1, 8, 4, 4), (1, 5)],
        type="PSROIPooling",
        name="p1",
    )
    with pytest.raises(LayerParamError, match=r"layer 'p1' \(PSROIPooling\).*N \(1\), got \[1"):
        layer(torch.randn(1, 8, 4, 4), torch.tensor([[1.0, 0, 0, 3, 3]]))
