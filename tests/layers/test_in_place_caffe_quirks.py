"""In-place quirks of Caffe's CPU layers, against numpy ports of the C++ loops.

Eltwise with its top named as bottom 0 (the only in-place form Caffe's Net accepts) reads
the top it writes; both faces must agree.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcaffe
import torchcaffe as caffe

FLT_MAX = np.float32(3.4028234663852886e38)


def eltwise_cpu(op, k, coeff, stable, bottoms, top_diff):
    """EltwiseLayer Forward_cpu/Backward_cpu with top data and diff aliasing bottom k's."""
    b = [x.copy() for x in bottoms]
    n = len(b)
    if op == "SUM":
        b[k][...] = 0
        for i in range(n):
            b[k] += np.float32(coeff[i]) * b[i]  # axpy; b[i] is the top when i == k
    elif op == "MAX":
        b[k][...] = -FLT_MAX
        mask = np.where(b[0] > b[1], 0, 1)
        top = np.where(b[0] > b[1], b[0], b[1])
        b[k][...] = top
        for i in range(2, n):
            win = b[i] > b[k]
            mask = np.where(win, i, mask)
            b[k][...] = np.where(win, b[i], b[k])
    else:
        b[k][...] = b[0] * b[1] if k > 1 else bottoms[0] * bottoms[1]
        for i in range(2, n):
            b[k][...] = b[k] * b[i]
    top = b[k].copy()
    d = [None] * n
    d[k] = top_diff.copy()
    for i in range(n):
        if op == "SUM":
            g = np.float32(coeff[i]) * d[k]
        elif op == "MAX":
            g = np.where(mask == i, d[k], 0).astype(np.float32)
        else:
            if stable:
                local = np.prod([b[j] for j in range(n) if j != i], axis=0, dtype=np.float32)
            else:
                local = top / b[i]
            # the factor goes into bottom i's diff first: for i == k that is the top diff
            g = local * (local if i == k else d[k])
        d[i] = g
    return top, d


SLOPE_CONFIGS = [
    ("SUM", 0, [2.0, 3.0, -1.0], True),
    ("SUM", 0, None, True),
    ("MAX", 0, None, True),
    ("PROD", 0, None, True),
    ("PROD", 0, None, False),
]


def proto(op, k, coeff, stable):
    names = ["a", "b", "c"]
    params = f"operation: {op}"
    if coeff:
        params += "".join(f" coeff: {c}" for c in coeff)
    if not stable:
        params += " stable_prod_grad: false"
    inputs = "".join(f'input: "{n}" input_shape {{ dim: 2 dim: 3 }}\n' for n in names)
    bottoms = "".join(f'bottom: "{n}" ' for n in names)
    return (
        f"force_backward: true\n{inputs}"
        f'layer {{ name: "e" type: "Eltwise" {bottoms}top: "{names[k]}" '
        f"eltwise_param {{ {params} }} }}\n"
    )


def data():
    rng = np.random.default_rng(0)
    return [rng.uniform(-2, 2, (2, 3)).astype(np.float32) for _ in range(3)]


@pytest.mark.parametrize("op,k,coeff,stable", SLOPE_CONFIGS)
def test_eltwise_in_place_caffe_face(tmp_path, op, k, coeff, stable):
    path = tmp_path / "net.prototxt"
    path.write_text(proto(op, k, coeff, stable))
    net = caffe.Net(str(path), caffe.TRAIN)
    xs = data()
    for n, x in zip("abc", xs):
        net.blobs[n].data[...] = x
    net.forward()
    top_diff = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    top, diffs = eltwise_cpu(op, k, coeff or [1.0] * 3, stable, xs, top_diff)
    np.testing.assert_allclose(net.blobs["abc"[k]].data, top, rtol=1e-6)
    net.blobs["abc"[k]].diff[...] = top_diff
    net.backward()
    for n, want in zip("abc", diffs):
        np.testing.assert_allclose(net.blobs[n].diff, want, rtol=1e-6, atol=1e-7, err_msg=n)


@pytest.mark.parametrize("op,k,coeff,stable", SLOPE_CONFIGS)
def test_eltwise_in_place_torch_face(tmp_path, op, k, coeff, stable):
    path = tmp_path / "net.prototxt"
    path.write_text(proto(op, k, coeff, stable))
    model = torchcaffe.load(str(path))
    xs = [torch.tensor(x, requires_grad=True) for x in data()]
    top = model(**dict(zip("abc", xs)))["abc"[k]]
    top_diff = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    want_top, diffs = eltwise_cpu(op, k, coeff or [1.0] * 3, stable, data(), top_diff)
    np.testing.assert_allclose(top.detach().numpy(), want_top, rtol=1e-6)
    top.backward(torch.tensor(top_diff))
    for i, (x, want) in enumerate(zip(xs, diffs)):
        # the torch face's inputs are distinct tensors: bottom k's grad is its diff
        np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-6, atol=1e-7, err_msg=str(i))


# Neuron layers in place: Caffe's Backward reads the overwritten blob as its bottom data.
F32 = np.float32


def bnll_slope(x, y):
    e = np.exp(np.minimum(x, F32(50)))
    return e / (e + 1)


def relu_slope(s):
    return lambda x, y: (x > 0) + F32(s) * (x <= 0)


def elu_slope(a):
    return lambda x, y: (x > 0) + (F32(a) + y) * (x <= 0)


def log_slope(scale, shift, base):
    # backward_num_scale_ = input_scale_ / log(base), in float
    num = F32(scale) / F32(np.log(np.float64(base)))
    return lambda x, y: num / (x * F32(scale) + F32(shift))


def clip_slope(lo, hi):
    return lambda x, y: ((x >= F32(lo)) & (x <= F32(hi))).astype(F32)


def power_slope(p, scale, shift):
    ds = F32(p * scale)
    if p == 2:
        return lambda x, y: ds * F32(scale) * x + ds * F32(shift)
    return lambda x, y: ds * y / (F32(shift) + F32(scale) * x)


NEURONS = {
    "bnll": ('type: "BNLL"', bnll_slope),
    "relu": ('type: "ReLU" relu_param { negative_slope: -0.5 }', relu_slope(-0.5)),
    "elu": ('type: "ELU" elu_param { alpha: -0.7 }', elu_slope(-0.7)),
    "log": ('type: "Log" log_param { scale: 2 shift: 5 base: 3 }', log_slope(2, 5, 3)),
    "clip": ('type: "Clip" clip_param { min: -1 max: 0.5 }', clip_slope(-1, 0.5)),
    "power": ('type: "Power" power_param { power: 3 scale: 0.5 shift: 1 }', power_slope(3, 0.5, 1)),
    "power2": ('type: "Power" power_param { power: 2 scale: 2 shift: 1 }', power_slope(2, 2, 1)),
}

# ip -> neuron (in place on "h") -> EuclideanLoss against zeros: the solver sees it too.
NEURON_NET = """
force_backward: true
layer {{ name: "data" type: "Input" top: "x" top: "t"
  input_param {{ shape {{ dim: 2 dim: 3 }} shape {{ dim: 2 dim: 4 }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "x" top: "h"
  inner_product_param {{ num_output: 4 weight_filler {{ type: "uniform" min: -1 max: 1 }} }} }}
layer {{ name: "n" {layer} bottom: "h" top: "h" }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "t" top: "loss" }}
"""


def neuron_net(tmp_path, layer):
    path = tmp_path / "net.prototxt"
    path.write_text(NEURON_NET.format(layer=layer))
    return path


def inputs():
    rng = np.random.default_rng(1)
    return rng.uniform(-1, 1, (2, 3)).astype(F32), np.zeros((2, 4), F32)


# Power's and Log's Backward_cpu build the slope in the bottom diff, which in place is the
# top diff, then multiply it by itself: the loss's diff is lost (checked against BVLC Caffe
# 1.0 built from source, CPU).
SLOPE_SQUARED = {"log", "power", "power2"}


def expected_h_diff(net, slope, name=""):
    """Caffe: the loss writes h's diff (h - t), then the neuron scales it by its slope at h
    (Power, Log: replaces it by the slope squared)."""
    h = net.blobs["h"].data.copy()
    if name in SLOPE_SQUARED:
        return slope(h, h) * slope(h, h)
    return (h / F32(2)) * slope(h, h)


@pytest.mark.parametrize("name", sorted(NEURONS))
def test_in_place_neuron_caffe_face_forward_then_backward(tmp_path, name):
    layer, slope = NEURONS[name]
    net = caffe.Net(str(neuron_net(tmp_path, layer)), caffe.TRAIN)
    net.blobs["x"].data[...], net.blobs["t"].data[...] = inputs()
    net.forward()
    want = expected_h_diff(net, slope, name)
    net.backward()
    np.testing.assert_allclose(net.blobs["h"].diff, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", sorted(NEURONS))
def test_in_place_neuron_one_pass_and_torch_face(tmp_path, name):
    layer, slope = NEURONS[name]
    path = neuron_net(tmp_path, layer)
    net = caffe.Net(str(path), caffe.TRAIN)
    x, t = inputs()
    net.blobs["x"].data[...], net.blobs["t"].data[...] = x, t
    net.forward_backward()  # the solver's step: one autograd pass
    want = expected_h_diff(net, slope, name)
    w = net.params["ip"][0].data
    want_w = want.T @ x
    np.testing.assert_allclose(net.params["ip"][0].diff, want_w, rtol=1e-5, atol=1e-6)

    model = torchcaffe.load(str(path))
    with torch.no_grad():
        model.layer("ip").weight.copy_(torch.tensor(w))
        model.layer("ip").bias.zero_()
    out = model(x=torch.tensor(x), t=torch.tensor(t))
    out["loss"].backward()
    got = model.layer("ip").weight.grad.numpy()
    np.testing.assert_allclose(got, want_w, rtol=1e-5, atol=1e-6)  # same weights, bias 0


@pytest.mark.parametrize("one_pass", [False, True])
def test_in_place_chain_takes_slopes_at_the_final_blob(tmp_path, one_pass):
    # Clip then Power, both in place on h: Caffe's Clip Backward reads h after Power wrote it.
    layer = (
        'type: "Clip" clip_param { min: -1 max: 0.5 } bottom: "h" top: "h" }\n'
        'layer { name: "p" type: "Power" power_param { power: 2 shift: 1 }'
    )
    net = caffe.Net(str(neuron_net(tmp_path, layer)), caffe.TRAIN)
    x, t = inputs()
    net.blobs["x"].data[...], net.blobs["t"].data[...] = x, t
    if one_pass:
        net.forward_backward()
    else:
        net.forward()
        net.backward()
    h = net.blobs["h"].data.copy()
    # Power's in-place Backward leaves its slope squared (SLOPE_SQUARED); Clip scales that
    want = power_slope(2, 1, 1)(h, h) ** 2 * clip_slope(-1, 0.5)(h, h)
    np.testing.assert_allclose(net.blobs["h"].diff, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(net.params["ip"][0].diff, want.T @ x, rtol=1e-5, atol=1e-6)


ELTWISE_PROD_IN_PLACE = """
force_backward: true
layer { name: "in" type: "Input" top: "a" top: "b" top: "c" top: "d" top: "e"
  input_param { shape { dim: 1 dim: 3 } } }
layer { name: "e1" type: "Eltwise" bottom: "a" bottom: "b" top: "a"
  eltwise_param { operation: PROD } }
layer { name: "e2" type: "Eltwise" bottom: "c" bottom: "d" bottom: "e" top: "c"
  eltwise_param { operation: PROD stable_prod_grad: false } }
"""


def test_in_place_prod_matches_real_caffe(tmp_path):
    # Expected values computed by BVLC Caffe 1.0 built from source (CPU, OpenBLAS), pycaffe:
    # bottom 0's diff is its factor squared, the later bottoms multiply by that
    path = tmp_path / "net.prototxt"
    path.write_text(ELTWISE_PROD_IN_PLACE)
    net = caffe.Net(str(path), caffe.TRAIN)
    vals = {"a": [0.5, -2, 3], "b": [1.5, 0.25, -1], "c": [2, -0.5, 1.25]}
    vals.update({"d": [-1, 4, 0.5], "e": [0.75, 2, -3]})
    for k, v in vals.items():
        net.blobs[k].data[...] = v
    net.forward()
    for k in "ac":
        net.blobs[k].diff[...] = [1.5, -2.0, 0.5]
    net.backward()
    want = {
        "a": ([0.75, -0.5, -3.0], [2.25, 0.0625, 1.0]),
        "b": ([1.5, 0.25, -1.0], [1.6875, -0.03125, -3.0]),
        "c": ([-1.5, -4.0, -1.875], [1.0, 1.0, 1.0]),
        "d": ([-1.0, 4.0, 0.5], [1.5, -1.0, -3.75]),
        "e": ([0.75, 2.0, -3.0], [-2.0, -2.0, 0.625]),
    }
    for k, (data, diff) in want.items():
        np.testing.assert_allclose(net.blobs[k].data.ravel(), data, rtol=1e-6, err_msg=k)
        np.testing.assert_allclose(net.blobs[k].diff.ravel(), diff, rtol=1e-6, err_msg=k)
