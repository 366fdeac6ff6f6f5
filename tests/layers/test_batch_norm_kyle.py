"""BatchNormKyle (brocolli): BatchNorm's statistics and running sums plus alpha / beta; no
alpha / beta diffs with global statistics (Caffe's backward returns early); 3 or 5 blobs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError

AB = "batch_norm_param { use_alpha_beta: true moving_average_fraction: 0.9 eps: 0.001 }"
CASES = [
    LayerCase("BatchNormKyle", AB, ((4, 3, 2, 5),), id="kyle_train_ab"),
    LayerCase("BatchNormKyle", "", ((5, 3),), id="kyle_train_plain"),
    LayerCase(
        "BatchNormKyle",
        "batch_norm_param { use_alpha_beta: true }",
        phase="TEST",
        id="kyle_test_ab",
    ),
    LayerCase(
        "BatchNormKyle",
        "batch_norm_param { use_global_stats: true }",
        ((3, 4, 2),),
        id="kyle_global",
    ),
]


def f32(v):
    return float(np.float32(v))


def _axes(x):
    return tuple(i for i in range(x.ndim) if i != 1)


def _b(v, x):
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def ref_kyle_train(x, blobs, maf, eps, top_diff):
    """Forward_cpu / Backward_cpu with batch statistics -> (top, new blobs 0-2, bottom diff,
    alpha diff, beta diff)."""
    maf, eps = f32(maf), f32(eps)
    axes = _axes(x)
    mean = x.mean(axis=axes)
    var = ((x - _b(mean, x)) ** 2).mean(axis=axes)
    m = x.size // x.shape[1]
    corr = m / (m - 1) if m > 1 else 1.0
    new = [blobs[0] * maf + mean, blobs[1] * maf + corr * var, blobs[2] * maf + 1]
    std = np.sqrt(_b(var, x) + eps)
    x_norm = (x - _b(mean, x)) / std
    alpha, beta = blobs[3], blobs[4]
    top = x_norm * _b(alpha, x) + _b(beta, x)
    dy = top_diff * _b(alpha, x)  # x_norm_'s diff
    bottom = dy - _b(dy.mean(axis=axes), x) - _b((dy * x_norm).mean(axis=axes), x) * x_norm
    return top, new, bottom / std, (x_norm * top_diff).sum(axis=axes), top_diff.sum(axis=axes)


def _layer(snippet, shape, phase, blobs):
    layer, _ = make_layer(snippet, [shape], type="BatchNormKyle", phase=phase, dtype=torch.float64)
    with torch.no_grad():
        for blob, value in zip(layer.param_blobs(), blobs):
            blob.copy_(torch.tensor(value))
    return layer


def _blobs(rng, c, factor):
    return [
        rng.standard_normal(c),
        rng.uniform(0.5, 2.0, c),
        np.array([factor]),
        rng.uniform(0.5, 2.0, c),
        rng.standard_normal(c),
    ]


@pytest.mark.parametrize("shape", [(4, 3, 2, 5), (5, 3), (2, 3, 4)])
def test_train_forward_backward_and_running_sums(shape):
    rng = np.random.default_rng(21)
    blobs = _blobs(rng, shape[1], 2.5)
    layer = _layer(AB, shape, "TRAIN", blobs)
    x = rng.standard_normal(shape) * 2 + 1
    xt = torch.tensor(x, requires_grad=True)
    top = layer(xt)
    top_diff = rng.standard_normal(shape)
    want_top, want_blobs, want_dx, want_da, want_db = ref_kyle_train(x, blobs, 0.9, 1e-3, top_diff)
    np.testing.assert_allclose(top.detach().numpy(), want_top, rtol=1e-10, atol=1e-12)
    for got, want in zip(layer.param_blobs()[:3], want_blobs):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    top.backward(torch.tensor(top_diff))
    np.testing.assert_allclose(xt.grad.numpy(), want_dx, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(layer.alpha.grad.numpy(), want_da, rtol=1e-10)
    np.testing.assert_allclose(layer.beta.grad.numpy(), want_db, rtol=1e-10)


@pytest.mark.parametrize("factor", [4.0, 0.0])
def test_test_phase_global_stats_and_no_alpha_beta_diffs(factor):
    rng = np.random.default_rng(22)
    shape = (2, 3, 3, 4)
    blobs = _blobs(rng, 3, factor)
    layer = _layer("batch_norm_param { use_alpha_beta: true }", shape, "TEST", blobs)
    x = rng.standard_normal(shape)
    xt = torch.tensor(x, requires_grad=True)
    top = layer(xt)
    scale = 0.0 if factor == 0 else 1 / factor
    std = np.sqrt(_b(blobs[1] * scale, x) + f32(1e-5))
    x_norm = (x - _b(blobs[0] * scale, x)) / std
    np.testing.assert_allclose(
        top.detach().numpy(), x_norm * _b(blobs[3], x) + _b(blobs[4], x), rtol=1e-12
    )
    top_diff = rng.standard_normal(shape)
    top.backward(torch.tensor(top_diff))
    np.testing.assert_allclose(xt.grad.numpy(), top_diff * _b(blobs[3], x) / std, rtol=1e-12)
    assert layer.alpha.grad is None and layer.beta.grad is None
    for got, before in zip(layer.param_blobs()[:3], blobs):  # no running-sum update
        np.testing.assert_array_equal(got.numpy(), before)


def test_blobs_without_and_with_alpha_beta():
    plain, _ = make_layer("", [(2, 3, 4)], type="BatchNormKyle")
    assert plain.blob_names == ["mean", "variance", "scale_factor"]
    assert not any(isinstance(b, torch.nn.Parameter) for b in plain.param_blobs())
    ab, _ = make_layer(
        "batch_norm_param { use_alpha_beta: true }", [(2, 3, 4)], type="BatchNormKyle"
    )
    assert ab.blob_names == ["mean", "variance", "scale_factor", "alpha", "beta"]
    np.testing.assert_array_equal(ab.alpha.detach().numpy(), np.ones(3))
    np.testing.assert_array_equal(ab.beta.detach().numpy(), np.zeros(3))
    assert all(float(b.abs().sum()) == 0 for b in ab.param_blobs()[:3])


def test_param_specs_left_as_written():
    """Unlike BVLC's BatchNorm, the fork neither adds lr_mult: 0 specs nor rejects others."""
    layer, _ = make_layer("param { lr_mult: 1 } " + AB, [(2, 3, 4)], type="BatchNormKyle")
    assert [s.lr_mult for s in layer.layer_param.param] == [1]


def test_use_global_stats_overrides_phase():
    layer, _ = make_layer(
        "batch_norm_param { use_global_stats: false }", [(4, 3)], type="BatchNormKyle", phase="TEST"
    )
    assert layer.uses_global_stats is False
    layer, _ = make_layer("", [(4, 3)], type="BatchNormKyle", phase="TRAIN")
    assert layer.uses_global_stats is False
    layer.eval()
    assert layer.uses_global_stats is True


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c.name)
def test_gradient_train(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize("case", CASES[2:], ids=lambda c: c.name)
def test_gradient_global_bottoms(case):
    layer, bottoms = case.build()
    with torch.no_grad():
        layer.scale_factor.fill_(2.0)
        layer.variance.fill_(3.0)
    check_layer_gradient(layer, bottoms, check=("bottoms",))


def test_error_one_axis_bottom():
    with pytest.raises(LayerParamError, match=r"layer 'k1' \(BatchNormKyle\).*num_axes >= 2"):
        make_layer("", [(5,)], type="BatchNormKyle", name="k1")


def test_error_channels_change():
    layer, _ = make_layer("", [(2, 3, 4)], type="BatchNormKyle", name="k1")
    with pytest.raises(LayerParamError, match=r"layer 'k1' \(BatchNormKyle\).*channels"):
        layer.output_shapes([(2, 5, 4)])
