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
        elif stable:
            g = np.prod([b[j] for j in range(n) if j != i], axis=0, dtype=np.float32) * d[k]
        else:
            g = top / b[i] * d[k]
        d[i] = g
    return top, d


CASES = [
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


@pytest.mark.parametrize("op,k,coeff,stable", CASES)
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


@pytest.mark.parametrize("op,k,coeff,stable", CASES)
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
