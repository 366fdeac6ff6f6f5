"""PriorBox (SSD fork): prior order per cell, truncated int sizes, steps, img_size, offset,
clip, one or four variances, aspect-ratio de-duplication, no backward, parameter errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

FEAT, IMAGE = (2, 3, 4, 5), (2, 3, 40, 60)

CASES = [
    LayerCase(
        "PriorBox",
        "prior_box_param { min_size: 12 max_size: 25 aspect_ratio: 2 "
        "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 }",
        (FEAT, IMAGE),
        id="priorbox_ssd",
    ),
    LayerCase(
        "PriorBox",
        "prior_box_param { min_size: 7.5 min_size: 15 aspect_ratio: 3 "
        "flip: false clip: true step_h: 9 step_w: 11 offset: 0.25 }",
        (FEAT, IMAGE),
        id="priorbox_two_sizes_clip",
    ),
    LayerCase(
        "PriorBox",
        "prior_box_param { min_size: 20 img_h: 50 img_w: 70 step: 16 }",
        ((1, 2, 3, 6), (1, 3, 8, 8)),
        id="priorbox_img_hw_step",
    ),
]


def ref_prior_box(
    layer_h,
    layer_w,
    img_h,
    img_w,
    min_sizes,
    max_sizes=(),
    ars=(),
    flip=True,
    clip=False,
    variance=(0.1,),
    step_h=0.0,
    step_w=0.0,
    offset=0.5,
):
    """The fork's Forward_cpu loops: float32 centers and box sizes, double divisions."""
    f32 = np.float32
    ratios = [1.0]
    for ar in ars:
        if all(abs(f32(ar) - r) >= 1e-6 for r in ratios):
            ratios.append(f32(ar))
            if flip:
                ratios.append(f32(1.0 / f32(ar)))
    if step_h == 0 or step_w == 0:
        step_w, step_h = f32(img_w) / f32(layer_w), f32(img_h) / f32(layer_h)
    boxes = []
    for h in range(layer_h):
        for w in range(layer_w):
            cx = (f32(w) + f32(offset)) * f32(step_w)
            cy = (f32(h) + f32(offset)) * f32(step_h)
            for s, min_size in enumerate(min_sizes):
                m = int(f32(min_size))
                sizes = [(f32(m), f32(m))]
                if max_sizes:
                    side = f32(math.sqrt(m * int(f32(max_sizes[s]))))
                    sizes.append((side, side))
                for ar in ratios:
                    if abs(ar - 1.0) < 1e-6:
                        continue
                    sizes.append((f32(m * math.sqrt(ar)), f32(m / math.sqrt(ar))))
                for bw, bh in sizes:
                    cxd, cyd, bwd, bhd = float(cx), float(cy), float(bw), float(bh)
                    boxes += [
                        (cxd - bwd / 2) / img_w,
                        (cyd - bhd / 2) / img_h,
                        (cxd + bwd / 2) / img_w,
                        (cyd + bhd / 2) / img_h,
                    ]
    boxes = np.array(boxes)
    if clip:
        boxes = np.clip(boxes, 0.0, 1.0)
    var = np.tile(np.asarray(variance, dtype=f32).astype(np.float64), len(boxes) // len(variance))
    return np.stack([boxes, var])[None]


def _run(snippet, feat=FEAT, image=IMAGE, dtype=torch.float32):
    layer, bottoms = make_layer(
        f"prior_box_param {{ {snippet} }}", [feat, image], type="PriorBox", dtype=dtype
    )
    with torch.no_grad():
        return layer, layer(*[b.to(dtype) for b in bottoms])


@pytest.mark.parametrize(
    "snippet,kw",
    [
        (
            "min_size: 12 max_size: 25 aspect_ratio: 2 variance: 0.1 variance: 0.1 variance: 0.2 "
            "variance: 0.2",
            dict(min_sizes=[12], max_sizes=[25], ars=[2], variance=[0.1, 0.1, 0.2, 0.2]),
        ),
        (
            "min_size: 7.5 min_size: 15 max_size: 11 max_size: 31.9 aspect_ratio: 2 "
            "aspect_ratio: 3 aspect_ratio: 0.5 aspect_ratio: 1 flip: true clip: true",
            dict(min_sizes=[7.5, 15], max_sizes=[11, 31.9], ars=[2, 3, 0.5, 1], clip=True),
        ),
        (
            "min_size: 30 aspect_ratio: 0.3 flip: false step_h: 9 step_w: 11 offset: 0.25 "
            "variance: 0.3",
            dict(
                min_sizes=[30],
                ars=[0.3],
                flip=False,
                step_h=9,
                step_w=11,
                offset=0.25,
                variance=[0.3],
            ),
        ),
        ("min_size: 9 step: 7.5 offset: 0", dict(min_sizes=[9], step_h=7.5, step_w=7.5, offset=0)),
    ],
)
def test_forward_matches_reference(snippet, kw):
    layer, top = _run(snippet)
    want = ref_prior_box(4, 5, 40, 60, **kw)
    assert top.shape == want.shape == (1, 2, 4 * 5 * layer.num_priors * 4)
    np.testing.assert_array_equal(top.numpy(), want.astype(np.float32))


def test_forward_float64_keeps_double_divisions():
    _, top = _run("min_size: 13 max_size: 21 aspect_ratio: 3", dtype=torch.float64)
    want = ref_prior_box(4, 5, 40, 60, [13], [21], [3])
    np.testing.assert_allclose(top.numpy(), want, rtol=0, atol=1e-15)


def test_img_size_and_img_hw_override_the_image_bottom():
    _, top = _run("min_size: 16 img_size: 100")
    np.testing.assert_array_equal(
        top.numpy(), ref_prior_box(4, 5, 100, 100, [16]).astype(np.float32)
    )
    _, top = _run("min_size: 16 img_h: 90 img_w: 120")
    np.testing.assert_array_equal(
        top.numpy(), ref_prior_box(4, 5, 90, 120, [16]).astype(np.float32)
    )


def test_legacy_height_width_of_lower_rank_bottoms():
    _, top = _run("min_size: 4", feat=(2, 3, 6), image=(2, 3, 30, 30))
    np.testing.assert_array_equal(top.numpy(), ref_prior_box(6, 1, 30, 30, [4]).astype(np.float32))


def test_duplicate_aspect_ratios_and_prior_count():
    layer, _ = _run(
        "min_size: 8 max_size: 9 aspect_ratio: 2 aspect_ratio: 2.0000001 "
        "aspect_ratio: 0.5 aspect_ratio: 3"
    )
    assert layer.aspect_ratios == pytest.approx([1, 2, 0.5, 3, 1 / 3])
    assert layer.num_priors == 6
    assert layer.output_shapes([(1, 1, 7, 2), (1, 3, 9, 9)]) == [(1, 2, 7 * 2 * 6 * 4)]


def test_values_of_bottoms_are_unused_and_no_backward():
    layer, bottoms = make_layer("prior_box_param { min_size: 10 }", [FEAT, IMAGE], type="PriorBox")
    a = layer(*bottoms)
    b = layer(*[torch.full_like(x, 7.0, requires_grad=True) for x in bottoms])
    assert torch.equal(a, b) and not b.requires_grad
    assert not layer.has_backward and not layer.allow_force_backward(0)


@pytest.mark.parametrize(
    "snippet,match",
    [
        ("", r"must provide min_size"),
        ("min_size: 0", r"min_size must be positive"),
        ("min_size: 10 max_size: 20 max_size: 30", r"max_size needs one entry per min_size"),
        ("min_size: 10 max_size: 10", r"max_size must be greater than min_size"),
        ("min_size: 10 variance: 0.1 variance: 0.2", r"variance takes one value or exactly four"),
        ("min_size: 10 variance: 0", r"variance must be positive"),
        ("min_size: 10 img_size: 30 img_h: 30", r"either img_size or img_h/img_w"),
        ("min_size: 10 img_h: 30", r"img_size / img_h / img_w should be larger than 0"),
        ("min_size: 10 step: 8 step_w: 8", r"either step or step_h/step_w"),
        ("min_size: 10 step: 0", r"step / step_h / step_w should be larger than 0"),
    ],
)
def test_error_bad_params(snippet, match):
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(PriorBox\): " + match):
        make_layer(f"prior_box_param {{ {snippet} }}", [FEAT, IMAGE], type="PriorBox")


def test_error_bottom_rank_and_empty_map():
    with pytest.raises(LayerParamError, match=r"bottom 0 must have at most 4 axes"):
        make_layer("prior_box_param { min_size: 4 }", [(1, 2, 3, 4, 5), IMAGE], type="PriorBox")
    with pytest.raises(LayerParamError, match=r"non-empty height and width"):
        make_layer("prior_box_param { min_size: 4 }", [(1, 2, 0, 4), IMAGE], type="PriorBox")
