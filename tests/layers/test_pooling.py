"""Pooling: output size (CEIL/FLOOR, last-window rule), MAX ties and mask, AVE divisor,
global pooling, STOCHASTIC statistics, and Caffe's parameter checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from tests.helpers.ops import RecordOps
from torchcaffe.errors import LayerParamError
from torchcaffe.ops import pooling

FLT_MAX = float(np.finfo(np.float32).max)


def _positive(shape):
    return lambda g: [torch.rand(shape, generator=g, dtype=torch.float64) + 0.1]


CASES = [
    LayerCase("Pooling", "pooling_param { pool: MAX kernel_size: 3 stride: 2 }", ((2, 3, 8, 7),)),
    LayerCase(
        "Pooling",
        "pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }",
        ((2, 3, 6, 7),),
        n_tops=2,
        id="max_mask",
    ),
    LayerCase(
        "Pooling", "pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }", ((2, 3, 6, 7),)
    ),
    LayerCase(
        "Pooling",
        "pooling_param { pool: AVE kernel_h: 3 kernel_w: 2 pad_h: 2 pad_w: 1 stride: 2 }",
        ((2, 3, 6, 7),),
        id="ave_big_pad",
    ),
    LayerCase("Pooling", "pooling_param { pool: MAX global_pooling: true }", ((2, 3, 4, 5),)),
    LayerCase(
        "Pooling",
        "pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 2 }",
        ((2, 3, 4, 5),),
        make_bottoms=_positive((2, 3, 4, 5)),
        deterministic=False,
    ),
    LayerCase(
        "Pooling",
        "pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 2 }",
        ((2, 3, 4, 5),),
        phase="TEST",
        make_bottoms=_positive((2, 3, 4, 5)),
        id="stochastic_test",
    ),
]


def pooled(size, k, s, p, ceil, clip):
    q = (size + 2 * p - k) / s
    out = (math.ceil(q) if ceil else math.floor(q)) + 1
    return out - 1 if clip and (out - 1) * s >= size + p else out


def ref_pool(x, pool, kernel, stride, pad, ceil=True):
    """Caffe's PoolingLayer::Forward_cpu loops (MAX from -FLT_MAX with strict >; AVE divides by
    the window clipped to size + pad). Returns (top, mask)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pad
    clip = ph > 0 or pw > 0
    oh, ow = pooled(h, kh, sh, ph, ceil, clip), pooled(w, kw, sw, pw, ceil, clip)
    top = np.zeros((n, c, oh, ow))
    mask = -np.ones((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * sh - ph, j * sw - pw
            if pool == "MAX":
                he, we = min(hs + kh, h), min(ws + kw, w)
                hs, ws = max(hs, 0), max(ws, 0)
                best = np.full((n, c), -FLT_MAX)
                for y in range(hs, he):
                    for z in range(ws, we):
                        v = x[:, :, y, z]
                        better = v > best
                        best = np.where(better, v, best)
                        mask[:, :, i, j] = np.where(better, y * w + z, mask[:, :, i, j])
                top[:, :, i, j] = best
            else:
                he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
                size = (he - hs) * (we - ws)
                hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
                top[:, :, i, j] = x[:, :, hs:he, ws:we].sum(axis=(2, 3)) / size
    return top, mask


def _run(snippet, shape, n_tops=1, phase="TRAIN", x=None):
    layer, bottoms = make_layer(
        snippet,
        [shape],
        type="Pooling",
        n_tops=n_tops,
        phase=phase,
        dtype=torch.float64,
        bottoms=None if x is None else [torch.as_tensor(x)],
    )
    out = layer(*bottoms)
    return layer, bottoms, out


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
@pytest.mark.parametrize(
    "geom",
    [
        dict(k=(3, 3), s=(2, 2), p=(0, 0)),  # ceil: 8 -> 4
        dict(k=(3, 3), s=(2, 2), p=(1, 1)),
        dict(k=(2, 3), s=(1, 2), p=(0, 1)),
        dict(k=(1, 3), s=(3, 2), p=(0, 1)),  # pad on one axis: the last-window rule on both
        dict(k=(1, 2), s=(3, 2), p=(0, 0)),  # no pad: the last row's window starts past H
        dict(k=(3, 2), s=(3, 2), p=(2, 1)),  # pad > kernel / 2: beyond torch's limit
        dict(k=(4, 3), s=(3, 2), p=(1, 2)),
    ],
)
def test_forward_matches_caffe_loops(pool, geom):
    (kh, kw), (sh, sw), (ph, pw) = geom["k"], geom["s"], geom["p"]
    snippet = (
        f"pooling_param {{ pool: {pool} kernel_h: {kh} kernel_w: {kw} stride_h: {sh} "
        f"stride_w: {sw} pad_h: {ph} pad_w: {pw} }}"
    )
    _, (x,), out = _run(snippet, (2, 3, 8, 7), n_tops=2 if pool == "MAX" else 1)
    top = out[0] if pool == "MAX" else out
    want, want_mask = ref_pool(x.numpy(), pool, geom["k"], geom["s"], geom["p"])
    np.testing.assert_allclose(top.detach().numpy(), want, rtol=1e-12)
    if pool == "MAX":
        np.testing.assert_array_equal(out[1].numpy(), want_mask)


@pytest.mark.parametrize(
    "round_spec,ceil",
    [
        ("round_mode: FLOOR", False),
        ("", True),
        ("ceil_mode: false", False),
        ("ceil_mode: true", True),
    ],
)
def test_forward_round_mode(round_spec, ceil):
    snippet = f"pooling_param {{ pool: AVE kernel_size: 3 stride: 2 {round_spec} }}"
    layer, (x,), top = _run(snippet, (2, 3, 8, 6))
    assert top.shape == (2, 3, 4 if ceil else 3, 3 if ceil else 2)
    want, _ = ref_pool(x.numpy(), "AVE", (3, 3), (2, 2), (0, 0), ceil=ceil)
    np.testing.assert_allclose(top.numpy(), want, rtol=1e-12)


def test_forward_ave_divisor_counts_padding_up_to_size_plus_pad():
    x = np.ones((1, 1, 4, 5))
    _, _, top = _run("pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }", x.shape, x=x)
    # corner windows see 4 of 9 real pixels; the last column's window is clipped at W + pad
    want, _ = ref_pool(x, "AVE", (3, 3), (2, 2), (1, 1))
    np.testing.assert_allclose(top.numpy(), want)
    assert top[0, 0, 0, 0] == pytest.approx(4 / 9)


def test_forward_global_pooling_follows_bottom_shape():
    layer, (x,), top = _run("pooling_param { pool: AVE global_pooling: true }", (2, 3, 4, 5))
    np.testing.assert_allclose(top.numpy(), x.numpy().mean(axis=(2, 3), keepdims=True))
    y = layer(torch.ones(2, 3, 6, 2, dtype=torch.float64))
    assert y.shape == (2, 3, 1, 1)


def test_forward_max_ties_first_in_scan_order_gets_gradient():
    x = torch.tensor(
        [[[[1.0, 3.0, 3.0], [3.0, 0.0, 3.0]]]], dtype=torch.float64, requires_grad=True
    )
    layer, _, (top, mask) = _run(
        "pooling_param { pool: MAX kernel_size: 2 stride: 1 }", (1, 1, 2, 3), n_tops=2, x=x
    )
    assert mask.tolist() == [[[[1.0, 1.0]]]]
    top.sum().backward()
    assert x.grad.tolist() == [[[[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]]]


def test_forward_max_ignores_nan_and_floors_at_flt_max():
    x = np.array([[[[np.nan, 1.0, -np.inf, -np.inf]]]])
    _, _, (top, mask) = _run(
        "pooling_param { pool: MAX kernel_h: 1 kernel_w: 2 stride: 2 }", x.shape, n_tops=2, x=x
    )
    assert top.tolist() == [[[[1.0, -FLT_MAX]]]]
    assert mask.tolist() == [[[[1.0, -1.0]]]]


def test_under_autograd_max_pool_keeps_the_layout_and_skips_an_idle_floor():
    # A training forward pools in the bottom's own layout, and with nothing to floor (no NaN,
    # nothing <= -FLT_MAX) straight on the bottom: one autograd node. Values and gradients
    # equal those of the channels_last kernel.
    snippet = "pooling_param { pool: MAX kernel_size: 3 stride: 2 }"
    layer, _ = make_layer(snippet, [(2, 3, 9, 8)], type="Pooling")
    x = torch.randn(2, 3, 9, 8, requires_grad=True)
    top = layer(x)
    assert type(top.grad_fn).__name__ == "MaxPool2DWithIndicesBackward0"
    assert top.grad_fn.next_functions[0][0].variable is x
    assert top.is_contiguous()
    x_cl = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    want = layer(x_cl)
    assert torch.equal(top, want)
    g = torch.randn(top.shape)
    top.backward(g)
    want.backward(g)
    assert torch.equal(x.grad, x_cl.grad)


def test_under_autograd_a_minus_inf_that_loses_its_window_needs_no_floor():
    # The check is on the top: -inf (or -FLT_MAX) beaten by a larger value in its window, as
    # after a masking op, leaves the bottom unfloored (one autograd node); values and gradient
    # are those of the floored bottom.
    x = torch.tensor([[[[-math.inf, 1.0, 2.0, -FLT_MAX]]]]).repeat(2, 3, 1, 1)
    layer, _ = make_layer(
        "pooling_param { pool: MAX kernel_h: 1 kernel_w: 2 stride: 2 }",
        [tuple(x.shape)],
        type="Pooling",
    )
    fast = x.clone().requires_grad_()
    top = layer(fast)
    assert type(top.grad_fn).__name__ == "MaxPool2DWithIndicesBackward0"
    assert top.grad_fn.next_functions[0][0].variable is fast
    with torch.no_grad():
        want = layer(pooling._floor_at_flt_max(x))
    assert torch.equal(top, want)
    top.sum().backward()
    assert fast.grad[0, 0].tolist() == [[0.0, 1.0, 1.0, 0.0]]


@pytest.mark.parametrize("values", ["randn", "nan", "-inf wins"])
def test_inference_floors_only_a_top_that_needs_it(values, monkeypatch):
    # Without autograd too the bottom is pooled as it is; only a top whose minimum is NaN or
    # <= -FLT_MAX sends it through the floor (whose result is then Caffe's).
    x = torch.randn(2, 3, 6, 8)
    if values == "nan":
        x[1, 2, 3, 4] = math.nan
    elif values == "-inf wins":
        x[0, 1, 0:2, 0:2] = -math.inf
    layer, _ = make_layer(
        "pooling_param { pool: MAX kernel_size: 2 stride: 2 }", [tuple(x.shape)], type="Pooling"
    )
    floors = []
    real = pooling._floor_at_flt_max
    monkeypatch.setattr(pooling, "_floor_at_flt_max", lambda t: floors.append(1) or real(t))
    with torch.inference_mode():
        top = layer(x)
    assert len(floors) == (values != "randn")
    want, _ = ref_pool(x.double().numpy(), "MAX", (2, 2), (2, 2), (0, 0))
    np.testing.assert_array_equal(top.double().numpy(), want.astype(np.float32))


@pytest.mark.parametrize(
    "geometry", [((3, 3), (2, 2), (0, 0), True), ((2, 3), (1, 2), (1, 1), False)]
)
def test_floored_max_pool_function_equals_pooling_the_floored_bottom(geometry):
    # _FlooredMaxPool2d (used under autograd) against autograd through where + max_pool2d:
    # same top, indices and bottom gradient, with NaN, -inf, -FLT_MAX, +inf and whole
    # windows of NaN in the bottom.
    kernel, stride, pad, ceil = geometry
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64, generator=gen)
    x[0, 0, :3, :3] = math.nan
    x[0, 1, 4, 4] = -math.inf
    x[1, 2, 2:5, 1:4] = -FLT_MAX
    x[1, 0, 7, 7] = math.inf
    a = x.clone().requires_grad_()
    y, idx = pooling._FlooredMaxPool2d.apply(a, kernel, stride, pad, ceil)
    b = x.clone().requires_grad_()
    floored = torch.where(b > -FLT_MAX, b, -FLT_MAX)
    want, want_idx = F.max_pool2d(floored, kernel, stride, pad, 1, ceil, return_indices=True)
    assert torch.equal(y, want) and torch.equal(idx, want_idx)
    g = torch.randn(y.shape, dtype=torch.float64, generator=gen)
    y.backward(g)
    want.backward(g)
    assert torch.equal(a.grad, b.grad)
    assert (y == -FLT_MAX).any()  # some window's best was floored: its gradient went nowhere


def test_floored_max_pool_allows_a_later_in_place_write_to_its_bottom():
    # as autograd through the where did: the backward needs the bottom's layout, not its
    # values (channels_last kept)
    x = torch.randn(2, 3, 9, 8).contiguous(memory_format=torch.channels_last)
    x[0, 0, 0, 0] = math.nan
    a = x.clone().requires_grad_()
    b = a * 1.0
    y, _ = pooling._FlooredMaxPool2d.apply(b, (3, 3), (2, 2), (0, 0), True)
    b.mul_(2.0)  # a later in-place layer writes the pooled blob
    y.sum().backward()
    c = x.clone().requires_grad_()
    want, _ = pooling._FlooredMaxPool2d.apply(c * 1.0, (3, 3), (2, 2), (0, 0), True)
    want.sum().backward()
    assert torch.equal(a.grad, c.grad)
    assert a.grad.is_contiguous(memory_format=torch.channels_last)


def test_compiled_training_max_pool_equals_eager():
    x = torch.randn(2, 3, 9, 8, generator=torch.Generator().manual_seed(4))
    x[0, 0, :3, :3] = math.nan
    x[1, 1, 4, 4] = -math.inf
    layer, _ = make_layer(
        "pooling_param { pool: MAX kernel_size: 3 stride: 2 }",
        [tuple(x.shape)],
        type="Pooling",
        n_tops=2,
    )
    g = torch.randn(2, 3, 4, 4)
    runs = []
    for fn in (layer, torch.compile(layer, backend="aot_eager", fullgraph=True)):
        a = x.clone().requires_grad_()
        top, mask = fn(a)
        top.backward(g)
        runs.append((top.detach(), mask, a.grad))
    for want, got in zip(runs[0], runs[1]):
        assert torch.equal(got, want)
    assert (runs[0][1] == -1).any()  # the all-NaN window has no winner, as in Caffe


def test_under_autograd_max_pool_still_floors_nan_and_minus_inf():
    x = torch.tensor([[[[math.nan, 1.0, -math.inf, -math.inf]]]], requires_grad=True)
    layer, _ = make_layer(
        "pooling_param { pool: MAX kernel_h: 1 kernel_w: 2 stride: 2 }",
        [tuple(x.shape)],
        type="Pooling",
    )
    top = layer(x)
    assert top.tolist() == [[[[1.0, -FLT_MAX]]]]
    top.sum().backward()
    assert x.grad.tolist() == [[[[0.0, 1.0, 0.0, 0.0]]]]


@pytest.mark.parametrize("snippet", [c.snippet for c in CASES[:4]])
def test_gradient(snippet):
    layer, bottoms = make_layer(snippet, [(2, 3, 6, 7)], type="Pooling", dtype=torch.float64)
    check_layer_gradient(layer, bottoms, step=1e-4, threshold=1e-3)


def _stochastic_windows(phase, values, repeats=4000):
    """A (1, 1, 2, 2 * repeats) bottom tiled with the same 2x2 window, pooled 2x2/2."""
    block = np.array(values, dtype=np.float64).reshape(2, 2)
    x = torch.tensor(np.tile(block, (1, repeats))[None, None], requires_grad=True)
    layer, _ = make_layer(
        "pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 2 }",
        [tuple(x.shape)],
        type="Pooling",
        phase=phase,
        dtype=torch.float64,
    )
    return layer, x


def test_stochastic_train_samples_proportional_to_activation():
    values = [1.0, 2.0, 3.0, 4.0]
    layer, x = _stochastic_windows("TRAIN", values)
    torch.manual_seed(3)
    top = layer(x)
    freq = np.array([(top.detach().numpy() == v).mean() for v in values])
    want = np.array(values) / sum(values)
    # 4000 draws: standard error <= 0.008
    np.testing.assert_allclose(freq, want, atol=0.03)
    top.sum().backward()  # each window's gradient goes to the position it sampled
    grad = x.grad.numpy()[0, 0]
    assert set(np.unique(grad)) <= {0.0, 1.0}
    assert grad.reshape(2, -1, 2).sum(axis=(0, 2)).tolist() == [1.0] * 4000
    picked = np.where(grad == 1, x.detach().numpy()[0, 0], 0).reshape(2, -1, 2).sum(axis=(0, 2))
    np.testing.assert_array_equal(picked, top.detach().numpy().ravel())


def test_stochastic_train_zero_window_picks_first_and_never_a_zero_weight():
    layer, x = _stochastic_windows("TRAIN", [0.0, 5.0, 0.0, 0.0], repeats=200)
    assert (layer(x).detach().numpy() == 5.0).all()
    layer, x = _stochastic_windows("TRAIN", [0.0, 0.0, 0.0, 0.0], repeats=5)
    assert (layer(x).detach().numpy() == 0.0).all()


def test_stochastic_test_is_sum_sq_over_sum():
    layer, (x,), top = _run(
        "pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 }", (2, 3, 7, 6), phase="TEST"
    )
    xn = x.numpy()
    want = np.zeros(top.shape)
    for i in range(top.shape[2]):
        for j in range(top.shape[3]):
            win = xn[:, :, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3]
            s1, s2 = win.sum(axis=(2, 3)), (win**2).sum(axis=(2, 3))
            want[:, :, i, j] = np.where(s1 > 0, s2 / np.where(s1 > 0, s1, 1), 0)
    np.testing.assert_allclose(top.numpy(), want, rtol=1e-12)
    assert (want == 0).any() and (want != 0).any()  # both branches exercised


@pytest.mark.parametrize(
    "snippet,n_tops,shape,field",
    [
        ("pooling_param { pool: MAX }", 1, (2, 3, 4, 5), "kernel_size"),
        (
            "pooling_param { kernel_size: 2 kernel_h: 2 kernel_w: 2 }",
            1,
            (2, 3, 4, 5),
            "kernel_size",
        ),
        ("pooling_param { kernel_h: 2 }", 1, (2, 3, 4, 5), "kernel_h"),
        ("pooling_param { kernel_size: 0 }", 1, (2, 3, 4, 5), "kernel_size"),
        (
            "pooling_param { global_pooling: true kernel_size: 2 }",
            1,
            (2, 3, 4, 5),
            "global_pooling",
        ),
        ("pooling_param { global_pooling: true pad: 1 }", 1, (2, 3, 4, 5), "global_pooling"),
        ("pooling_param { kernel_size: 3 pad: 1 pad_h: 1 pad_w: 1 }", 1, (2, 3, 4, 5), "pad_h"),
        ("pooling_param { kernel_size: 3 stride_h: 2 }", 1, (2, 3, 4, 5), "stride_h"),
        ("pooling_param { kernel_size: 3 stride: 0 }", 1, (2, 3, 4, 5), "stride"),
        ("pooling_param { kernel_size: 3 pad: 3 }", 1, (2, 3, 4, 5), "pad"),
        ("pooling_param { pool: STOCHASTIC kernel_size: 3 pad: 1 }", 1, (2, 3, 4, 5), "STOCHASTIC"),
        ("pooling_param { pool: AVE kernel_size: 2 }", 2, (2, 3, 4, 5), "mask"),
        ("pooling_param { kernel_size: 2 }", 1, (2, 3, 4, 5, 6), "4 axes"),
        ("pooling_param { kernel_size: 6 round_mode: FLOOR }", 1, (2, 3, 4, 5), "output"),
        (
            "pooling_param { kernel_size: 2 round_mode: FLOOR ceil_mode: true }",
            1,
            (2, 3, 4, 5),
            "ceil_mode",
        ),
    ],
)
def test_error(snippet, n_tops, shape, field):
    with pytest.raises(LayerParamError, match=rf"layer 'p1' \(Pooling\).*{field}"):
        make_layer(snippet, [shape], type="Pooling", n_tops=n_tops, name="p1")


def test_error_bottom_shape_change_checked_in_forward():
    layer, _ = make_layer(
        "pooling_param { kernel_size: 3 }", [(2, 3, 4, 5)], type="Pooling", name="p1"
    )
    with pytest.raises(LayerParamError, match=r"layer 'p1' \(Pooling\).*output"):
        layer(torch.zeros(2, 3, 2, 2))


@pytest.mark.parametrize(
    "geometry, kernel, pad",
    [("kernel_size: 2 stride: 2", 2, 0), ("kernel_size: 3 stride: 2 pad: 1", 3, 1)],
)
def test_compiled_training_ave_pool_with_overhanging_windows_equals_eager(geometry, kernel, pad):
    """Caffe divides a window reaching past H + pad by its part up to there; inductor's own
    avg_pool2d backward got that divisor wrong, so such windows take the explicit sums."""
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    param = f"pooling_param {{ pool: AVE {geometry} }}"
    layer, _ = make_layer(param, [tuple(x.shape)], type="Pooling")
    runs = []
    for fn in (layer.double(), torch.compile(layer, fullgraph=True)):
        a = x.clone().requires_grad_()
        top = fn(a)
        top.backward(torch.linspace(-1.0, 1.0, top.numel(), dtype=top.dtype).reshape(top.shape))
        runs.append((top.detach(), a.grad))
    out = tuple(runs[0][0].shape[2:])
    assert pooling._overhangs((5, 6), (kernel, kernel), (2, 2), (pad, pad), out)
    for want, got in zip(runs[0], runs[1]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_compiled_max_pool_beside_other_consumers_has_eager_gradients():
    # torch 2.11's inductor got this bottom's gradient 0.16 off through _FlooredMaxPool2d
    # (a global MAX pool beside a convolution and a third consumer); on such a torch the
    # compiled pool takes autograd's own path (COMPILED_FLOORED_POOL)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 4, 10, 4, dtype=torch.float64, generator=gen)
    w = torch.randn(3, 4, 3, 3, dtype=torch.float64, generator=gen)
    layer, _ = make_layer(
        "pooling_param { pool: MAX global_pooling: true }", [x.shape], type="Pooling"
    )

    def step(bottom):
        s = torch.sigmoid(bottom)
        top = layer(s)
        top = top[0] if isinstance(top, tuple) else top
        return F.conv2d(s, w).sum() * 1.5 + (s.abs() * 0.3).sum() + (top * 2.0).sum()

    want = x.clone().requires_grad_()
    step(want).backward()
    got = x.clone().requires_grad_()
    torch._dynamo.reset()
    torch.compile(step)(got).backward()
    torch.testing.assert_close(got.grad, want.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gate", [True, False])
def test_compiled_max_pool_uses_the_function_only_where_inductor_compiles_it(gate, monkeypatch):
    monkeypatch.setattr(pooling, "COMPILED_FLOORED_POOL", gate)
    x = torch.randn(2, 3, 9, 8, requires_grad=True)
    eager, _ = pooling._max_pool(x, (3, 3), (2, 2), (0, 0), (4, 4), False)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    compiled, _ = pooling._max_pool(x, (3, 3), (2, 2), (0, 0), (4, 4), False)
    assert "FlooredMaxPool2d" not in type(eager.grad_fn).__name__  # no -FLT_MAX: no floor
    assert ("FlooredMaxPool2d" in type(compiled.grad_fn).__name__) == gate


def test_floored_max_pool_floors_in_one_op():
    """Inside the function autograd records nothing, so the floor is one nan_to_num (one
    kernel on a GPU) rather than a compare and a where."""
    x = torch.randn(2, 3, 9, 8, device="meta", requires_grad=True)
    with RecordOps() as ops:
        pooling._FlooredMaxPool2d.apply(x, (3, 3), (2, 2), (0, 0), True)
    names = ops.names
    assert names[:2] == ["nan_to_num.default", "max_pool2d_with_indices.default"], names


def test_floored_max_pool_backward_launches_only_the_mask_and_the_pooling_backward():
    """The backward is the mask of floored windows, in one op, and torch's pooling backward,
    and nothing more: no zero tensor filled for the indices' gradient (they take none), no
    scalar made a device tensor for a where, no bool mask between a compare and a fill (one
    kernel each on a GPU)."""
    x = torch.randn(2, 3, 9, 8, device="meta", requires_grad=True)
    y, _ = pooling._FlooredMaxPool2d.apply(x, (3, 3), (2, 2), (0, 0), True)
    g = torch.ones(y.shape, device="meta")
    with RecordOps() as ops:
        (grad,) = torch.autograd.grad(y, x, g)
    names = ops.names
    assert grad.shape == x.shape
    launched = [n for n in names if not n.startswith("detach")]
    assert launched == [
        "empty_strided.default",  # the bottom's layout (no kernel)
        "threshold_backward.default",  # the windows whose best was floored take none
        "max_pool2d_with_indices_backward.default",
    ], names
