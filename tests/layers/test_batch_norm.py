"""BatchNorm: batch statistics and Caffe's running-sum update in TRAIN, stored statistics over
the scale factor (0 -> 0) in TEST, use_global_stats, both backwards, 2-D inputs, buffers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcaffe
from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError, UnsupportedError
from torchcaffe.formats.prototxt import read_net

CASES = [
    LayerCase(
        "BatchNorm",
        "batch_norm_param { moving_average_fraction: 0.9 eps: 0.001 }",
        ((4, 3, 5, 2),),
        id="bn_train",
    ),
    LayerCase("BatchNorm", "", ((5, 3),), id="bn_train_2d"),
    LayerCase("BatchNorm", "batch_norm_param { eps: 0.5 }", phase="TEST", id="bn_test"),
    LayerCase(
        "BatchNorm",
        "batch_norm_param { use_global_stats: true }",
        ((3, 4, 2),),
        id="bn_train_use_global",
    ),
]


def f32(v):
    """The proto stores eps and moving_average_fraction as float: Caffe sees these values."""
    return float(np.float32(v))


def _axes(x):
    return tuple(i for i in range(x.ndim) if i != 1)


def _bcast(v, x):
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def ref_bn_train(x, blobs, maf, eps):
    """-> (top, updated blobs) from batch statistics, as Caffe's Forward_cpu."""
    maf, eps = f32(maf), f32(eps)
    mean = x.mean(axis=_axes(x))
    var = ((x - _bcast(mean, x)) ** 2).mean(axis=_axes(x))
    m = x.size // x.shape[1]
    corr = m / (m - 1) if m > 1 else 1.0
    new = [blobs[0] * maf + mean, blobs[1] * maf + corr * var, blobs[2] * maf + 1]
    top = (x - _bcast(mean, x)) / np.sqrt(_bcast(var, x) + eps)
    return top, new


def ref_bn_train_diff(x, top_diff, eps):
    """(dy - mean(dy) - mean(dy * y) * y) / sqrt(var + eps), means over all axes but 1."""
    axes, eps = _axes(x), f32(eps)
    mean = x.mean(axis=axes)
    var = ((x - _bcast(mean, x)) ** 2).mean(axis=axes)
    std = np.sqrt(_bcast(var, x) + eps)
    y = (x - _bcast(mean, x)) / std
    mdy = _bcast(top_diff.mean(axis=axes), x)
    mdyy = _bcast((top_diff * y).mean(axis=axes), x)
    return (top_diff - mdy - mdyy * y) / std


def ref_bn_global(x, blobs, eps):
    """-> (top, std): stored statistics times 1 / scale factor (0 when the factor is 0)."""
    factor = 0.0 if blobs[2][0] == 0 else 1.0 / blobs[2][0]
    mean, var = blobs[0] * factor, blobs[1] * factor
    std = np.sqrt(_bcast(var, x) + f32(eps))
    return (x - _bcast(mean, x)) / std, std


def _layer(snippet, shape, phase, blobs=None):
    layer, _ = make_layer(snippet, [shape], type="BatchNorm", phase=phase, dtype=torch.float64)
    if blobs is not None:
        with torch.no_grad():
            for buf, value in zip(layer.param_blobs(), blobs):
                buf.copy_(torch.tensor(value))
    return layer


def _blobs(rng, c, factor):
    return [rng.standard_normal(c), rng.uniform(0.5, 2.0, c), np.array([factor])]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # 0 / 0, as Caffe
@pytest.mark.parametrize("eps", [1e-3, 0.0])  # Caffe takes eps 0; torch's kernel refuses it
@pytest.mark.parametrize("shape", [(4, 3, 5, 2), (5, 3), (2, 3, 4), (1, 3)])
def test_train_forward_backward_and_blob_update(shape, eps):
    rng = np.random.default_rng(11)
    blobs = _blobs(rng, shape[1], 2.5)
    layer = _layer(
        f"batch_norm_param {{ moving_average_fraction: 0.9 eps: {eps} }}", shape, "TRAIN", blobs
    )
    x = rng.standard_normal(shape) * 3 + 1
    xt = torch.tensor(x, requires_grad=True)
    top = layer(xt)
    want_top, want_blobs = ref_bn_train(x, blobs, 0.9, eps)
    np.testing.assert_allclose(top.detach().numpy(), want_top, rtol=1e-10, atol=1e-12)
    for got, want in zip(layer.param_blobs(), want_blobs):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    top_diff = rng.standard_normal(shape)
    top.backward(torch.tensor(top_diff))
    np.testing.assert_allclose(
        xt.grad.numpy(), ref_bn_train_diff(x, top_diff, eps), rtol=1e-8, atol=1e-10
    )
    # a second forward accumulates again from the updated blobs
    layer(torch.tensor(x))
    _, twice = ref_bn_train(x, want_blobs, 0.9, eps)
    for got, want in zip(layer.param_blobs(), twice):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


@pytest.mark.parametrize("factor", [4.0, 0.0])
def test_test_phase_uses_stored_statistics(factor):
    rng = np.random.default_rng(12)
    shape = (2, 3, 4, 5)
    blobs = _blobs(rng, 3, factor)
    layer = _layer("", shape, "TEST", blobs)
    x = rng.standard_normal(shape)
    xt = torch.tensor(x, requires_grad=True)
    top = layer(xt)
    want, std = ref_bn_global(x, blobs, 1e-5)
    np.testing.assert_allclose(top.detach().numpy(), want, rtol=1e-12)
    top_diff = rng.standard_normal(shape)
    top.backward(torch.tensor(top_diff))
    np.testing.assert_allclose(xt.grad.numpy(), top_diff / std, rtol=1e-12)
    for got, before in zip(layer.param_blobs(), blobs):  # TEST never updates the blobs
        np.testing.assert_array_equal(got.numpy(), before)


@pytest.mark.parametrize("factor", [999.98, 3.0, 1.0, 0.0, -0.0, float("nan")])
def test_global_stats_are_caffes_float32_arithmetic(factor):
    # Caffe: scale = factor == 0 ? 0 : 1 / factor (in float), then mean * scale, var * scale.
    layer, _ = make_layer("", [(2, 3, 4)], type="BatchNorm", phase="TEST")
    rng = np.random.default_rng(14)
    mean, var = rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 2, 3).astype("f4")
    with torch.no_grad():
        for buf, value in zip(layer.param_blobs(), [mean, var, np.float32([factor])]):
            buf.copy_(torch.from_numpy(value))
    scale = np.float32(0) if factor == 0 else np.float32(1) / np.float32(factor)
    got = layer.global_stats()
    np.testing.assert_array_equal(got[0].numpy(), mean * scale)
    np.testing.assert_array_equal(got[1].numpy(), var * scale)
    # factor 1 (a deploy net's): the blobs themselves, no arithmetic
    assert (got[0] is layer.mean and got[1] is layer.variance) == (factor == 1.0)


def test_use_global_stats_overrides_phase():
    rng = np.random.default_rng(13)
    shape = (3, 4, 2, 5)
    blobs = _blobs(rng, 4, 2.0)
    x = rng.standard_normal(shape)
    glob = _layer("batch_norm_param { use_global_stats: true eps: 1e-4 }", shape, "TRAIN", blobs)
    np.testing.assert_allclose(
        glob(torch.tensor(x)).numpy(), ref_bn_global(x, blobs, 1e-4)[0], rtol=1e-12
    )
    np.testing.assert_array_equal(glob.scale_factor.numpy(), [2.0])
    batch = _layer("batch_norm_param { use_global_stats: false }", shape, "TEST", blobs)
    np.testing.assert_allclose(
        batch(torch.tensor(x)).numpy(), ref_bn_train(x, blobs, 0.999, 1e-5)[0], rtol=1e-10
    )
    np.testing.assert_allclose(batch.scale_factor.numpy(), [2.0 * f32(0.999) + 1], rtol=1e-12)


def test_train_eval_switch_statistics_when_unset():
    layer = _layer("", (4, 3), "TRAIN")
    assert layer.uses_global_stats is False
    layer.eval()
    assert layer.uses_global_stats is True


def test_batch_statistics_couple_samples_global_ones_do_not():
    rng = np.random.default_rng(14)
    shape = (6, 3, 4)
    blobs = _blobs(rng, 3, 3.0)
    x = torch.tensor(rng.standard_normal(shape) * 2 + 5)
    other = x.clone()
    other[1:] = torch.tensor(rng.standard_normal((5, 3, 4)))
    glob = _layer("", shape, "TEST", blobs)
    torch.testing.assert_close(glob(x)[0], glob(other)[0], rtol=0, atol=0)
    torch.testing.assert_close(glob(x[:1])[0], glob(x)[0], rtol=0, atol=0)
    batch = _layer("", shape, "TRAIN", blobs)
    y = batch(x)
    # normalized per channel over the batch: zero mean, unit (biased) variance up to eps
    np.testing.assert_allclose(y.mean(dim=(0, 2)).numpy(), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(dim=(0, 2), unbiased=False).numpy(), 1, rtol=1e-4)
    assert not torch.allclose(batch(other)[0], y[0])


def test_in_place_net_build_leaves_blobs_and_each_forward_updates_once():
    text = """
    layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 4 dim: 3 } } }
    layer { name: "bn" type: "BatchNorm" bottom: "x" top: "x"
            batch_norm_param { moving_average_fraction: 0.5 } }
    """
    net = torchcaffe.load(read_net(text), phase="train")
    bn = net.layer("bn")
    assert float(bn.scale_factor) == 0
    x = torch.randn(4, 3)
    y = net(x=x)["x"]
    torch.testing.assert_close(y.mean(0), torch.zeros(3), atol=1e-6, rtol=0)
    net(x=x)
    assert float(bn.scale_factor) == 1.5
    torch.testing.assert_close(bn.mean, x.mean(0) * 1.5)


def test_blobs_are_buffers_in_caffe_order():
    layer = _layer("", (2, 3, 4), "TRAIN")
    assert list(layer.named_parameters()) == []
    assert layer.blob_names == ["mean", "variance", "scale_factor"]
    assert [tuple(b.shape) for b in layer.param_blobs()] == [(3,), (3,), (1,)]
    assert all(float(b.abs().sum()) == 0 for b in layer.param_blobs())
    assert set(layer.state_dict()) == {"mean", "variance", "scale_factor"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, threshold=4e-3)


def test_gradient_test_phase_with_stored_statistics():
    layer = _layer("", (2, 3, 4), "TEST", _blobs(np.random.default_rng(15), 3, 2.0))
    check_layer_gradient(layer, [torch.randn(2, 3, 4, dtype=torch.float64)])


@pytest.mark.parametrize(
    "snippet,shape,what,cls",
    [
        ("", (5,), r"at least 2 axes", LayerParamError),
        ("param { lr_mult: 1 }", (2, 3), r"lr_mult", LayerParamError),
        (
            "param { lr_mult: 0 } param { lr_mult: 0 } param { lr_mult: 0.1 }",
            (2, 3),
            r"param 2",
            LayerParamError,
        ),
        ("batch_norm_param { use_alpha_beta: true }", (2, 3), r"use_alpha_beta", UnsupportedError),
        # torch's kernels raised a bare ValueError at the first forward
        ("batch_norm_param { eps: -1e-9 }", (2, 3), r"negative eps", UnsupportedError),
    ],
)
def test_error(snippet, shape, what, cls):
    with pytest.raises(cls, match=rf"layer 'bn1' \(BatchNorm\).*{what}"):
        make_layer(snippet, [shape], type="BatchNorm", name="bn1")


def test_frozen_param_specs_are_accepted():
    snippet = "param { lr_mult: 0 } param { lr_mult: 0 } param { lr_mult: 0 decay_mult: 0 }"
    layer, _ = make_layer(snippet, [(2, 3)], type="BatchNorm")
    assert len(layer.param_blobs()) == 3


def test_error_channels_change():
    layer, _ = make_layer("", [(2, 3, 4)], type="BatchNorm", name="bn1")
    with pytest.raises(LayerParamError, match=r"layer 'bn1' \(BatchNorm\).*channels"):
        layer.output_shapes([(2, 4, 4)])  # once per input shape, not inside forward


def _ops_run(fn) -> list[str]:
    """The aten ops ``fn`` dispatches (on the meta device: what a GPU would launch)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: list[str] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return ops


def test_global_stats_off_the_cpu_are_computed_once_per_change_of_the_blobs():
    """Off the CPU the factor cannot be read without a sync, so the five small ops run once and
    their result is kept until a blob changes: not again on every forward."""
    layer, _ = make_layer("", [(2, 3, 4)], type="BatchNorm", phase="TEST")
    layer.to("meta")
    first = layer.global_stats()
    assert not _ops_run(layer.global_stats)
    assert layer.global_stats()[0] is first[0]
    with torch.no_grad():
        layer.scale_factor.mul_(2)  # an in-place write bumps the version: computed again
    assert "aten.reciprocal.default" in _ops_run(layer.global_stats)
    again = layer.global_stats()
    layer.stats_cache.forget()  # a write the version does not show (TorchNet.params_changed)
    assert layer.global_stats()[0] is not again[0]


def test_cached_global_stats_are_the_same_arithmetic_and_take_no_grad():
    layer, _ = make_layer("", [(2, 3, 4)], type="BatchNorm", phase="TEST")
    with torch.no_grad():
        layer.mean.copy_(torch.tensor([1.0, -2.0, 3.0]))
        layer.variance.copy_(torch.tensor([0.5, 2.0, 4.0]))
        layer.scale_factor.fill_(3.0)
    sources = (layer.mean, layer.variance, layer.scale_factor)
    with torch.inference_mode():  # a later training run reads what inference cached
        cached = layer.stats_cache.get(sources, layer._scaled_stats)
    scale = np.float32(1) / np.float32(3)  # Caffe's float arithmetic, independently
    want = (np.float32([1, -2, 3]) * scale, np.float32([0.5, 2, 4]) * scale)
    for got, expected in zip(cached, want):
        np.testing.assert_array_equal(got.numpy(), expected)
        assert not got.is_inference() and not got.requires_grad


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_layer_keeps_float32_running_sums(dtype):
    """Caffe's running sums reach 1000 times the statistics: a float16 variance sum of a
    variance near 100 passed 65504 (inf), bfloat16's stopped growing at 256 updates. They stay
    float32 after .half() / .bfloat16(); the top is in the bottom's dtype."""
    x = torch.randn(8, 2, 4, 4, generator=torch.Generator().manual_seed(0)) * 10 + 5
    ref, _ = make_layer("", [x.shape], type="BatchNorm", bottoms=[x])
    layer, _ = make_layer("", [x.shape], type="BatchNorm", bottoms=[x], dtype=dtype)
    assert all(b.dtype == torch.float32 for b in layer.buffers())
    xr = x.to(dtype)
    with torch.no_grad():
        for _ in range(1500):
            assert layer(xr).dtype == dtype
            ref(xr.float())
    for name, want in ref.state_dict().items():
        torch.testing.assert_close(layer.state_dict()[name], want, rtol=5e-3, atol=0)
    layer.eval()
    ref.eval()
    with torch.no_grad():
        y = layer(xr)
        assert y.dtype == dtype
        tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
        torch.testing.assert_close(y.float(), ref(xr.float()), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_net_folds_with_float32_statistics(dtype):
    """The folds (into a convolution, and a BatchNorm + Scale alone after a Concat) take the
    float32 statistics and give tops in the net's dtype."""
    net = torchcaffe.load(
        read_net(
            'input: "data" input_shape { dim: 2 dim: 3 dim: 6 dim: 6 }\n'
            'layer { name: "c1" type: "Convolution" bottom: "data" top: "c1" '
            "convolution_param { num_output: 4 kernel_size: 1 "
            "weight_filler { type: 'xavier' } } }\n"
            'layer { name: "bn1" type: "BatchNorm" bottom: "c1" top: "c1" }\n'
            'layer { name: "cat" type: "Concat" bottom: "c1" bottom: "data" top: "cat" }\n'
            'layer { name: "bn2" type: "BatchNorm" bottom: "cat" top: "cat" }\n'
            'layer { name: "sc" type: "Scale" bottom: "cat" top: "cat" '
            "scale_param { bias_term: true } }"
        ),
        phase="train",
    )
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(0)) * 3
    for _ in range(3):
        net(x)
    want = net.eval()(x.to(dtype).float())["cat"]
    got = net.to(dtype)(x.to(dtype))["cat"]
    assert got.dtype == dtype
    tol = 3e-2 if dtype == torch.bfloat16 else 4e-3
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
