"""ROIPooling against numpy ports of rbgirshick/caffe-fast-rcnn src/caffe/layers/
roi_pooling_layer.cpp (forward loops) and roi_pooling_layer.cu (ROIPoolBackward): C rounding,
floor/ceil bins, clipping, empty bins, first-maximum ties, the kernel's backward tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

FLT_MAX = np.finfo(np.float32).max
# [n x1 y1 x2 y2] in image pixels (spatial_scale 0.25 below): ordinary, tiny, inverted (-> 1x1),
# partly and fully outside the map, and corners whose scaled value is an exact .5 (C rounds away
# from zero: 2.5 -> 3, -0.5 -> -1).
ROIS = [
    [0, 4, 6, 40, 30],
    [1, 0, 0, 3, 3],
    [1, 20, 20, 8, 8],
    [0, -10, -6, 60, 70],
    [1, 50, 44, 90, 99],
    [0, 10, -2, 26, 18],
    [1, 1.9, 3.6, 35.3, 22.2],
]
# The same without the inverted ROI, whose pooled value Caffe's backward ignores (so finite
# differences disagree with it by design).
WELL_FORMED = ROIS[:2] + ROIS[3:]
SNIPPET = "roi_pooling_param { pooled_h: 3 pooled_w: 4 spatial_scale: 0.25 }"


def make_bottoms(gen, shape=(2, 3, 12, 10)):
    """Features with distinct values (spaced 0.1, so finite differences keep the argmax)."""
    count = int(np.prod(shape))
    x = (torch.randperm(count, generator=gen).double() * 0.1 - count * 0.05).reshape(shape)
    return [x, torch.tensor(WELL_FORMED, dtype=torch.float64)]


CASES = [
    LayerCase("ROIPooling", SNIPPET, [(2, 3, 12, 10), (6, 5)], make_bottoms=make_bottoms),
    LayerCase(
        "ROIPooling",
        "roi_pooling_param { pooled_h: 2 pooled_w: 2 }",
        [(2, 3, 12, 10), (6, 5)],
        make_bottoms=make_bottoms,
    ),
]


def c_round(v):
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def ref_roi_pool(x, rois, ph_, pw_, scale):
    """The .cpp's loops in float32: returns top and argmax (flat h * W + w, -1 when none)."""
    f = np.float32
    x, rois = x.astype(f), rois.astype(f)
    _, c, h, w = x.shape
    top = np.full((len(rois), c, ph_, pw_), -FLT_MAX, f)
    arg = np.full(top.shape, -1)
    for n, roi in enumerate(rois):
        b = int(roi[0])
        sw, sh, ew, eh = (int(c_round(f(v) * f(scale))) for v in roi[1:])
        bin_h = f(max(eh - sh + 1, 1)) / f(ph_)
        bin_w = f(max(ew - sw + 1, 1)) / f(pw_)
        for ph in range(ph_):
            for pw in range(pw_):
                hs = min(max(int(np.floor(f(ph) * bin_h)) + sh, 0), h)
                he = min(max(int(np.ceil(f(ph + 1) * bin_h)) + sh, 0), h)
                ws = min(max(int(np.floor(f(pw) * bin_w)) + sw, 0), w)
                we = min(max(int(np.ceil(f(pw + 1) * bin_w)) + sw, 0), w)
                if he <= hs or we <= ws:
                    top[n, :, ph, pw] = 0
                    continue
                for ch in range(c):
                    for y in range(hs, he):
                        for xx in range(ws, we):
                            if x[b, ch, y, xx] > top[n, ch, ph, pw]:
                                top[n, ch, ph, pw] = x[b, ch, y, xx]
                                arg[n, ch, ph, pw] = y * w + xx
    return top, arg


def ref_backward(top_diff, arg, rois, shape, scale):
    """ROIPoolBackward in float32: every bottom element sums the diffs of the bins, among the
    ROIs holding it and the bins the kernel's float range allows, whose argmax it is."""
    f = np.float32
    n_, _, h_, w_ = shape
    ph_, pw_ = arg.shape[2:]
    diff = np.zeros(shape)
    for n, y, x in np.ndindex(n_, h_, w_):
        for r, roi in enumerate(rois.astype(f)):
            if int(roi[0]) != n:
                continue
            sw, sh, ew, eh = (int(c_round(v * f(scale))) for v in roi[1:])
            if not (sw <= x <= ew and sh <= y <= eh):
                continue
            bin_h = f(max(eh - sh + 1, 1)) / f(ph_)
            bin_w = f(max(ew - sw + 1, 1)) / f(pw_)
            p0 = min(max(int(np.floor(f(y - sh) / bin_h)), 0), ph_)
            p1 = min(max(int(np.ceil(f(y - sh + 1) / bin_h)), 0), ph_)
            q0 = min(max(int(np.floor(f(x - sw) / bin_w)), 0), pw_)
            q1 = min(max(int(np.ceil(f(x - sw + 1) / bin_w)), 0), pw_)
            for ph in range(p0, p1):
                for pw in range(q0, q1):
                    won = arg[r, :, ph, pw] == y * w_ + x
                    diff[n, won, y, x] += top_diff[r, won, ph, pw]
    return diff


@pytest.mark.parametrize(
    "ph,pw,scale,shape",
    [
        (3, 4, 0.25, (2, 3, 12, 10)),
        (2, 2, 1.0, (2, 3, 12, 10)),
        (6, 5, 0.0625, (2, 4, 9, 13)),
        (7, 7, 0.5, (2, 2, 40, 45)),
    ],
)
def test_forward_backward_match_reference(ph, pw, scale, shape):
    snippet = f"roi_pooling_param {{ pooled_h: {ph} pooled_w: {pw} spatial_scale: {scale} }}"
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=gen)
    rois = torch.tensor(ROIS, dtype=torch.float32)
    layer, _ = make_layer(snippet, [shape, (7, 5)], type="ROIPooling", bottoms=[x, rois])
    x.requires_grad_(True)
    top = layer(x, rois)
    want, arg = ref_roi_pool(x.detach().numpy(), rois.numpy(), ph, pw, scale)
    np.testing.assert_array_equal(top.detach().numpy(), want)
    with torch.no_grad():  # the inference path tracks no positions
        np.testing.assert_array_equal(layer(x, rois).numpy(), want)
    assert layer.output_shapes([shape, (7, 5)]) == [want.shape]
    top_diff = np.random.default_rng(0).standard_normal(want.shape).astype(np.float32)
    top.backward(torch.from_numpy(top_diff))
    want_diff = ref_backward(top_diff, arg, rois.numpy(), shape, scale)
    np.testing.assert_allclose(x.grad.numpy(), want_diff, rtol=1e-6, atol=1e-6)


def test_ties_take_the_first_maximum_and_neg_flt_max_never_wins():
    x = torch.zeros(1, 2, 4, 4)
    x[0, 1] = -float("inf")
    x[0, 1, 3, 3] = float("nan")
    rois = torch.tensor([[0, 0, 0, 3, 3]], dtype=torch.float32)
    layer, _ = make_layer(
        "roi_pooling_param { pooled_h: 1 pooled_w: 1 }",
        [(1, 2, 4, 4), (1, 5)],
        type="ROIPooling",
        bottoms=[x, rois],
    )
    x.requires_grad_(True)
    top = layer(x, rois)
    assert top[0, 0, 0, 0] == 0 and top[0, 1, 0, 0] == -FLT_MAX  # no candidate: -FLT_MAX
    with torch.no_grad():
        assert torch.equal(layer(x, rois), top)
    top.sum().backward()
    assert x.grad[0, 0].flatten().tolist() == [1.0] + [0.0] * 15  # the first of the tied zeros
    assert not x.grad[0, 1].any()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0])


def test_backward_skips_argmax_outside_the_roi():
    """Float rounding stretches the last of 7 bins of a 57-wide ROI to 58 columns (57 / 7 * 7 >
    57 in float32): the forward pools column 57, Caffe's backward (in_roi) sends it nothing.
    An inverted ROI is pooled as 1x1 and gets no gradient either."""
    x = torch.zeros(2, 2, 3, 60)
    x[0, :, :, 57] = 5.0
    x[1, :, 2, 30] = 1.0
    rois = torch.tensor([[0, 0, 0, 56, 2], [1, 30, 2, 20, 0]], dtype=torch.float32)
    layer, _ = make_layer(
        "roi_pooling_param { pooled_h: 1 pooled_w: 7 }",
        [(2, 2, 3, 60), (2, 5)],
        type="ROIPooling",
        bottoms=[x, rois],
    )
    x.requires_grad_(True)
    top = layer(x, rois)
    assert top[0, :, 0, 6].tolist() == [5.0, 5.0]
    assert top[1, :, 0].tolist() == [[1.0] * 7] * 2  # every bin is [2, 3) x [30, 31)
    top.sum().backward()
    assert not x.grad[0, :, :, 57].any() and not x.grad[1].any()
    assert x.grad[0, :, 0, :49].sum() == 2 * 6  # the other six bins: first of their zeros
    want, arg = ref_roi_pool(x.detach().numpy(), rois.numpy(), 1, 7, 1.0)
    np.testing.assert_array_equal(top.detach().numpy(), want)
    np.testing.assert_array_equal(
        x.grad.numpy(), ref_backward(np.ones(want.shape), arg, rois.numpy(), x.shape, 1.0)
    )


def test_rois_get_no_gradient():
    layer, (x, rois) = CASES[0].build()
    x.requires_grad_(True)
    rois.requires_grad_(True)
    layer(x, rois).sum().backward()
    assert rois.grad is None and x.grad.any()


@pytest.mark.parametrize(
    "snippet,shapes,match",
    [
        ("roi_pooling_param { pooled_w: 2 }", [(1, 2, 4, 4), (3, 5)], "pooled_h must be > 0"),
        ("roi_pooling_param { pooled_h: 2 }", [(1, 2, 4, 4), (3, 5)], "pooled_w must be > 0"),
        ("roi_pooling_param { pooled_h: 2 pooled_w: 2 }", [(1, 2, 4, 4), (3, 4)], "R x 5"),
        ("roi_pooling_param { pooled_h: 2 pooled_w: 2 }", [(2, 4, 4), (3, 5)], "N x C x H x W"),
    ],
)
def test_error(snippet, shapes, match):
    with pytest.raises(LayerParamError, match=rf"layer 'r1' \(ROIPooling\).*{match}"):
        make_layer(snippet, shapes, type="ROIPooling", name="r1")


@pytest.mark.parametrize("index", [2, -1])
def test_error_batch_index_out_of_range(index):
    layer, _ = make_layer(
        "roi_pooling_param { pooled_h: 2 pooled_w: 2 }",
        [(2, 3, 4, 4), (1, 5)],
        type="ROIPooling",
        name="r1",
    )
    rois = torch.tensor([[index, 0, 0, 3, 3]], dtype=torch.float32)
    match = rf"layer 'r1' \(ROIPooling\).*N \(2\), got \[{index}"
    with pytest.raises(LayerParamError, match=match):
        layer(torch.randn(2, 3, 4, 4), rois)
