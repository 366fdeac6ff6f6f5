"""BN, the PSPNet and SegNet forks' batch normalization + scale/shift layer.

References: hszhao/PSPNet src/caffe/layers/bn_layer.cpp (slope, bias, stored mean and variance
as (1, C, 1, 1) blobs; TRAIN updates them by momentum; TEST normalizes with them but
backpropagates the batch formula; frozen: stored statistics, no slope / bias diffs) and
alexgkendall/caffe-segnet src/caffe/layers/bn_layer.cpp (scale, shift; LEARN: batch statistics
in either phase, var = E(x^2) - E(x)^2, eps 1e-9, tops 1, 2 = batch mean / variance;
INFERENCE: x * scale + shift).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from google.protobuf import text_format

import torchcaffe
from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError, LayerParamError
from torchcaffe.proto import caffe_pb2

PSP = "bn_param { slope_filler { type: 'constant' value: 1.5 } momentum: 0.8 eps: 0.001 }"
FROZEN = "bn_param { slope_filler { type: 'uniform' min: 0.5 max: 2 } frozen: true }"
SEGNET = (
    "bn_param { scale_filler { type: 'constant' value: 1.25 } "
    "shift_filler { type: 'constant' value: 0.5 } }"
)
INFER = "bn_param { bn_mode: INFERENCE scale_filler { type: 'uniform' min: 0.5 max: 2 } }"
CASES = [
    LayerCase("BN", PSP, ((2, 3, 4, 5),), id="bn_psp_train"),
    LayerCase("BN", "", ((4, 3),), phase="TEST", id="bn_psp_test_2d"),
    LayerCase("BN", FROZEN, ((3, 2, 5),), id="bn_psp_frozen"),
    LayerCase("BN", SEGNET, ((2, 3, 4, 5),), id="bn_segnet_learn"),
    LayerCase("BN", SEGNET, ((4, 3, 2),), n_tops=3, phase="TEST", id="bn_segnet_learn_stats"),
    LayerCase("BN", INFER, ((3, 4, 2),), phase="TEST", id="bn_segnet_inference"),
]


def f32(v):
    return float(np.float32(v))


def _rows(x):
    """Legacy (num, channels, height * width) view."""
    shape4 = tuple(x.shape) + (1,) * (4 - x.ndim)
    return x.reshape(shape4[0], shape4[1], -1), shape4


def _c(v):
    return np.asarray(v).reshape(-1, 1)


def ref_pspnet(x, slope, bias, mean, var, eps, momentum, batch):
    """PSPNet Forward_cpu -> (top, stored mean, stored var, x_hat, inv_std)."""
    r, _ = _rows(x)
    if batch:  # spatial mean, then batch mean, as the two gemv calls
        mu = r.mean(axis=2).mean(axis=0)
        v = ((r - _c(mu)) ** 2).mean(axis=2).mean(axis=0)
        m = f32(momentum)
        mean, var = (1 - m) * mu + m * mean, (1 - m) * v + m * var
    else:
        mu, v = mean, var
    inv_std = (v + f32(eps)) ** -0.5
    x_hat = (r - _c(mu)) * _c(inv_std)
    top = x_hat * _c(slope) + _c(bias)
    return top.reshape(x.shape), mean, var, x_hat, inv_std


def ref_pspnet_diff(x_hat, inv_std, slope, top_diff, frozen=False):
    """PSPNet Backward_cpu -> (bottom diff as rows, slope diff, bias diff)."""
    g, _ = _rows(top_diff)
    if frozen:
        return g * _c(slope) * _c(inv_std), None, None
    dxh = g * _c(slope)
    mean_dxh = dxh.mean(axis=(0, 2))
    mean_xd = (x_hat * dxh).mean(axis=(0, 2))
    dx = (dxh - _c(mean_dxh) - x_hat * _c(mean_xd)) * _c(inv_std)
    return dx, (x_hat * g).sum(axis=(0, 2)), g.sum(axis=(0, 2))


def ref_segnet(x, scale, shift, top_diff):
    """SegNet LEARN Forward_cpu / Backward_cpu -> (top, mean, var, dx, dscale, dshift)."""
    r, shape4 = _rows(x)
    g = top_diff.reshape(r.shape)
    mu = r.mean(axis=2).mean(axis=0)
    var = (r**2).mean(axis=2).mean(axis=0) - mu**2
    std = np.sqrt(var + f32(1e-9))
    xn = (r - _c(mu)) / _c(std)
    dxh = g * _c(scale)
    dx = (dxh - _c(dxh.mean(axis=(0, 2))) - xn * _c((xn * dxh).mean(axis=(0, 2)))) / _c(std)
    top = (xn * _c(scale) + _c(shift)).reshape(shape4)
    return top, mu, var, dx, (xn * g).sum(axis=(0, 2)), g.sum(axis=(0, 2))


def _layer(snippet, shape, phase, blobs, n_tops=1):
    layer, _ = make_layer(
        snippet, [shape], type="BN", phase=phase, n_tops=n_tops, dtype=torch.float64
    )
    with torch.no_grad():
        for blob, value in zip(layer.param_blobs(), blobs):
            blob.copy_(torch.tensor(value).reshape(blob.shape))
    return layer


def _psp_blobs(rng, c):
    return [
        rng.uniform(0.5, 2, c),
        rng.standard_normal(c),
        rng.standard_normal(c),
        rng.uniform(0.5, 2, c),
    ]


def _run(layer, x, top_diff):
    xt = torch.tensor(x, requires_grad=True)
    top = layer(xt)
    top.backward(torch.tensor(top_diff))
    return top.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (5, 3), (2, 3, 4)])
def test_pspnet_train_batch_stats_and_moving_average(shape):
    rng = np.random.default_rng(31)
    blobs = _psp_blobs(rng, shape[1])
    layer = _layer(PSP, shape, "TRAIN", blobs)
    x, g = rng.standard_normal(shape) * 2 + 1, rng.standard_normal(shape)
    top, dx = _run(layer, x, g)
    want, mean, var, x_hat, inv_std = ref_pspnet(x, *blobs, 0.001, 0.8, batch=True)
    np.testing.assert_allclose(top, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.mean.numpy().ravel(), mean, rtol=1e-12)
    np.testing.assert_allclose(layer.variance.numpy().ravel(), var, rtol=1e-12)
    want_dx, want_ds, want_db = ref_pspnet_diff(x_hat, inv_std, blobs[0], g)
    np.testing.assert_allclose(dx, want_dx.reshape(shape), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(layer.weight.grad.numpy().ravel(), want_ds, rtol=1e-10)
    np.testing.assert_allclose(layer.bias.grad.numpy().ravel(), want_db, rtol=1e-10)


def test_pspnet_test_stored_stats_and_batch_formula_backward():
    rng = np.random.default_rng(32)
    shape = (3, 4, 2, 5)
    blobs = _psp_blobs(rng, 4)
    layer = _layer("", shape, "TEST", blobs)
    x, g = rng.standard_normal(shape), rng.standard_normal(shape)
    top, dx = _run(layer, x, g)
    want, _, _, x_hat, inv_std = ref_pspnet(x, *blobs, 1e-5, 0.9, batch=False)
    np.testing.assert_allclose(top, want, rtol=1e-12)
    want_dx, want_ds, want_db = ref_pspnet_diff(x_hat, inv_std, blobs[0], g)
    np.testing.assert_allclose(dx, want_dx.reshape(shape), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(layer.weight.grad.numpy().ravel(), want_ds, rtol=1e-10)
    np.testing.assert_allclose(layer.bias.grad.numpy().ravel(), want_db, rtol=1e-10)
    exact = ref_pspnet_diff(x_hat, inv_std, blobs[0], g, frozen=True)[0]
    assert not np.allclose(dx, exact.reshape(shape), rtol=1e-3)  # Caffe's, not the exact one
    for blob, before in zip(layer.param_blobs()[2:], blobs[2:]):  # no moving-average update
        np.testing.assert_array_equal(blob.numpy().ravel(), before)


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_pspnet_frozen_uses_stored_stats_without_param_diffs(phase):
    rng = np.random.default_rng(33)
    shape = (2, 3, 3, 4)
    blobs = _psp_blobs(rng, 3)
    layer = _layer(FROZEN, shape, phase, blobs)
    x, g = rng.standard_normal(shape), rng.standard_normal(shape)
    top, dx = _run(layer, x, g)
    want, _, _, x_hat, inv_std = ref_pspnet(x, *blobs, 1e-5, 0.9, batch=False)
    np.testing.assert_allclose(top, want, rtol=1e-12)
    want_dx, _, _ = ref_pspnet_diff(x_hat, inv_std, blobs[0], g, frozen=True)
    np.testing.assert_allclose(dx, want_dx.reshape(shape), rtol=1e-12)
    assert layer.weight.grad is None and layer.bias.grad is None
    np.testing.assert_array_equal(layer.mean.numpy().ravel(), blobs[2])


def test_pspnet_eval_switches_to_stored_stats():
    layer, (x,) = make_layer(PSP, [(4, 3, 2, 2)], type="BN", dtype=torch.float64)
    layer.eval()
    with torch.no_grad():
        layer.variance.fill_(4.0)
        top = layer(x)
    torch.testing.assert_close(top, x / np.sqrt(4 + f32(1e-3)) * 1.5)
    assert float(layer.mean.abs().sum()) == 0


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3)])
def test_segnet_learn_batch_stats_in_either_phase(phase, shape):
    rng = np.random.default_rng(34)
    scale, shift = rng.uniform(0.5, 2, shape[1]), rng.standard_normal(shape[1])
    layer = _layer(SEGNET, shape, phase, [scale, shift], n_tops=3)
    x = rng.standard_normal(shape) * 1.5 + 0.5
    xt = torch.tensor(x, requires_grad=True)
    top, mean, var = layer(xt)
    shape4 = tuple(shape) + (1,) * (4 - len(shape))
    g = rng.standard_normal(shape4)
    top.backward(torch.tensor(g))
    want, w_mean, w_var, w_dx, w_ds, w_db = ref_segnet(x, scale, shift, g)
    assert tuple(top.shape) == shape4 and tuple(mean.shape) == (1, shape[1], 1, 1)
    np.testing.assert_allclose(top.detach().numpy(), want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(mean.numpy().ravel(), w_mean, rtol=1e-12)
    np.testing.assert_allclose(var.numpy().ravel(), w_var, rtol=1e-10)
    np.testing.assert_allclose(xt.grad.numpy(), w_dx.reshape(shape), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(layer.weight.grad.numpy().ravel(), w_ds, rtol=1e-9)
    np.testing.assert_allclose(layer.bias.grad.numpy().ravel(), w_db, rtol=1e-10)


def test_segnet_inference_is_scale_and_shift():
    rng = np.random.default_rng(35)
    shape = (3, 4, 2)
    scale, shift = rng.uniform(0.5, 2, 4), rng.standard_normal(4)
    layer = _layer(INFER, shape, "TRAIN", [scale, shift])
    x, g = rng.standard_normal(shape), rng.standard_normal((3, 4, 2, 1))
    top, dx = _run(layer, x, g)
    r, shape4 = _rows(x)
    np.testing.assert_allclose(top, (r * _c(scale) + _c(shift)).reshape(shape4), rtol=1e-14)
    np.testing.assert_allclose(dx, (g.reshape(r.shape) * _c(scale)).reshape(shape), rtol=1e-14)
    np.testing.assert_allclose(
        layer.weight.grad.numpy().ravel(), (r * g.reshape(r.shape)).sum(axis=(0, 2)), rtol=1e-12
    )


def test_blob_order_shapes_fillers_and_param_specs():
    psp, _ = make_layer(PSP, [(2, 3, 4, 5)], type="BN")
    assert psp.dialect == "pspnet" and psp.blob_names == ["weight", "bias", "mean", "variance"]
    assert all(tuple(b.shape) == (1, 3, 1, 1) for b in psp.param_blobs())
    assert [float(b.detach().sum()) for b in psp.param_blobs()] == [4.5, 0.0, 0.0, 0.0]
    assert [(s.lr_mult, s.decay_mult) for s in psp.layer_param.param] == [
        (1, 1),
        (1, 1),
        (0, 0),
        (0, 0),
    ]
    frozen, _ = make_layer(FROZEN, [(2, 3, 4, 5)], type="BN")
    assert float(frozen.variance.sum()) == 3.0
    assert all(s.lr_mult == 0 and s.decay_mult == 0 for s in frozen.layer_param.param)
    seg, _ = make_layer(SEGNET, [(2, 3, 4, 5)], type="BN")
    assert seg.dialect == "segnet" and seg.blob_names == ["weight", "bias"]
    assert [float(b.detach().sum()) for b in seg.param_blobs()] == [3.75, 1.5]


@pytest.mark.parametrize("bn_param,legacy", [("frozen: true", False), ("bn_mode: INFERENCE", True)])
def test_caffemodel_blobs_load(tmp_path, bn_param, legacy):
    """Published PSPNet models store 4 (1, C, 1, 1) blobs as shape, SegNet's 2 as legacy 4-D."""
    net_text = (
        'layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 '
        "dim: 4 dim: 4 } } }\n"
        f'layer {{ name: "bn" type: "BN" bottom: "x" top: "x" bn_param {{ {bn_param} }} }}'
    )
    net_param = text_format.Parse(net_text, caffe_pb2.NetParameter())
    values = [np.arange(3) + 10 * i + 1.0 for i in range(4 if "frozen" in bn_param else 2)]
    weights = caffe_pb2.NetParameter()
    layer = weights.layer.add(name="bn", type="BN")
    for v in values:
        blob = layer.blobs.add(data=v.tolist())
        if legacy:
            blob.num, blob.channels, blob.height, blob.width = 1, 3, 1, 1
        else:
            blob.shape.dim.extend([1, 3, 1, 1])
    path = tmp_path / "bn.caffemodel"
    path.write_bytes(weights.SerializeToString())
    net = torchcaffe.load(net_param, path)
    bn = net.layers[net.step("bn").key]
    for got, want in zip(bn.param_blobs(), values):
        np.testing.assert_array_equal(got.detach().numpy().ravel(), want)


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[5]], ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


def test_gradient_frozen_bottoms():
    layer, bottoms = CASES[2].build()
    with torch.no_grad():
        layer.mean.normal_()
        layer.variance.uniform_(0.5, 2)
    check_layer_gradient(layer, bottoms, check=("bottoms",))


@pytest.mark.parametrize(
    "snippet,n_tops,match",
    [
        ("bn_param { frozen: true bn_mode: INFERENCE }", 1, r"mixes SegNet fields.*bn_mode"),
        ("", 2, r"too many top blobs for the PSPNet dialect"),
        ("bn_param { bn_mode: INFERENCE }", 3, r"too many top blobs for the SegNet bn_mode"),
    ],
)
def test_error_params(snippet, n_tops, match):
    with pytest.raises(LayerParamError, match=rf"layer 'b1' \(BN\).*{match}"):
        make_layer(snippet, [(2, 3, 4)], type="BN", n_tops=n_tops, name="b1")


def test_error_more_than_three_tops():
    with pytest.raises(BlobWiringError, match=r"layer 'b1' \(BN\).*1 to 3 top"):
        make_layer(SEGNET, [(2, 3, 4)], type="BN", n_tops=4, name="b1")


def test_error_bottom_axes_and_channels():
    with pytest.raises(LayerParamError, match=r"layer 'b1' \(BN\).*num_axes <= 4"):
        make_layer("", [(2, 3, 2, 2, 2)], type="BN", name="b1")
    layer, _ = make_layer("", [(2, 3, 4)], type="BN", name="b1")
    with pytest.raises(LayerParamError, match=r"layer 'b1' \(BN\).*channels"):
        layer.output_shapes([(2, 5, 4)])
