"""InfogainLoss: -sum_l H[y, l] log(max(softmax_l, 1e-20)) / normalizer, H from a bottom or a
BlobProto file, axis, ignore_label, Caffe's gradient p * rowsum(H)[y] - H[y, :]."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError, PrototxtError
from torchcaffe.formats.binaryproto import write_blob_proto

THRESHOLD = float(np.float32(1e-20))


def _bottoms(shape, axis, with_h=True):
    def make(g):
        c = shape[axis]
        lshape = shape[:axis] + shape[axis + 1 :]
        out = [
            torch.randn(shape, generator=g, dtype=torch.float64),
            torch.randint(0, c, lshape, generator=g).double(),
        ]
        if with_h:
            out.append(torch.rand(c, c, generator=g, dtype=torch.float64))
        return out

    return make


CASES = [
    LayerCase(
        "InfogainLoss",
        "",
        ((5, 4), (5,), (4, 4)),
        make_bottoms=_bottoms((5, 4), 1),
        id="infogain_bottom_h",
    ),
    LayerCase(
        "InfogainLoss",
        "infogain_loss_param { axis: 2 } loss_param { ignore_label: 0 }",
        ((2, 3, 4, 5), (2, 3, 5), (1, 1, 4, 4)),
        make_bottoms=lambda g: (
            _bottoms((2, 3, 4, 5), 2)(g)[:2]
            + [torch.rand(1, 1, 4, 4, generator=g, dtype=torch.float64)]
        ),
        n_tops=2,
        id="infogain_axis2_ignore_prob",
    ),
]


def ref_infogain(x, label, h, axis, ignore, mode):
    """Caffe's Forward_cpu / Backward_cpu loops; returns (loss, diff for top diff 1)."""
    outer, c = int(np.prod(x.shape[:axis])), x.shape[axis]
    inner = int(np.prod(x.shape[axis + 1 :]))
    xs = x.reshape(outer, c, inner)
    e = np.exp(xs - xs.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    h = h.reshape(c, c)
    lab = np.trunc(label.reshape(outer, inner)).astype(int)
    loss, count, diff = 0.0, 0, np.zeros_like(p)
    for i in range(outer):
        for j in range(inner):
            y = lab[i, j]
            if ignore is not None and y == ignore:
                continue
            for k in range(c):
                loss -= h[y, k] * np.log(max(p[i, k, j], THRESHOLD))
                diff[i, k, j] = p[i, k, j] * h[y].sum() - h[y, k]
            count += 1
    norm = max(1.0, {"FULL": outer * inner, "VALID": count, "BATCH_SIZE": outer, "NONE": 1}[mode])
    return loss / norm, (diff / norm).reshape(x.shape)


def _run(snippet, x, label, h=None, n_tops=1, top_diff=1.0):
    shapes = [x.shape, label.shape] + ([] if h is None else [h.shape])
    layer, _ = make_layer(snippet, shapes, type="InfogainLoss", n_tops=n_tops, dtype=torch.float64)
    xt = torch.tensor(x, requires_grad=True)
    args = [xt, torch.tensor(label)] + ([] if h is None else [torch.tensor(h)])
    out = layer(*args)
    loss = out[0] if n_tops == 2 else out
    loss.backward(torch.tensor(top_diff, dtype=torch.float64))
    return out, xt.grad.numpy()


@pytest.mark.parametrize("mode", ["FULL", "VALID", "BATCH_SIZE", "NONE"])
@pytest.mark.parametrize("ignore", [None, 1])
def test_forward_backward_bottom_h(mode, ignore):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4, 2)) * 3
    label = rng.integers(0, 4, (3, 2)).astype(np.float64)
    h = rng.random((4, 4))
    ign = "" if ignore is None else f"ignore_label: {ignore}"
    loss, dx = _run(f"loss_param {{ normalization: {mode} {ign} }}", x, label, h, top_diff=1.5)
    want, want_dx = ref_infogain(x, label, h, 1, ignore, mode)
    np.testing.assert_allclose(float(loss.detach()), want, rtol=1e-12)
    np.testing.assert_allclose(dx, 1.5 * want_dx, rtol=1e-10, atol=1e-14)


def test_forward_h_from_source_file(tmp_path):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 4, 5))
    label = rng.integers(0, 4, (2, 3, 5)).astype(np.float64)
    h = rng.random((1, 1, 4, 4)).astype(np.float32)
    write_blob_proto(h, tmp_path / "H.binaryproto")
    snippet = f'infogain_loss_param {{ source: "{tmp_path / "H.binaryproto"}" axis: 2 }}'
    (loss, prob), dx = _run(snippet, x, label, n_tops=2)
    want, want_dx = ref_infogain(x, label, h.astype(np.float64), 2, None, "VALID")
    np.testing.assert_allclose(float(loss.detach()), want, rtol=1e-12)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-10, atol=1e-14)
    assert not prob.requires_grad


def test_clamp_gradient_is_caffes():
    x = np.array([[0.0, 100.0, -100.0]])  # p[2] ~ e^-200 underflows below 1e-20
    label = np.array([0.0])
    h = np.array([[1.0, 0.5, 2.0], [0, 1, 0], [0, 0, 1]])
    loss, dx = _run("", x, label, h)
    want, want_dx = ref_infogain(x, label, h, 1, None, "VALID")
    np.testing.assert_allclose(float(loss.detach()), want, rtol=1e-12)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-10, atol=1e-14)


def test_h_and_labels_get_no_gradient():
    layer, _ = make_layer("", [(2, 3), (2,), (3, 3)], type="InfogainLoss")
    # LossLayer's AllowForceBackward spares the labels only; Backward refuses H as well
    assert not layer.allow_force_backward(1) and layer.allow_force_backward(2)
    assert layer.backward_refusal([True, False, True], ["x", "y", "h"])
    h = torch.rand(3, 3, requires_grad=True)
    loss = layer(torch.randn(2, 3, requires_grad=True), torch.tensor([0.0, 2.0]), h)
    (gh,) = torch.autograd.grad(loss, [h], allow_unused=True)
    assert gh is None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=[0], top_index=(0, 0), max_points=60)


def test_error_normalize_deprecated():
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(InfogainLoss\).*normalize"):
        make_layer("loss_param { normalize: true }", [(2, 3), (2,), (3, 3)], type="InfogainLoss")


def test_error_no_source():
    with pytest.raises(LayerParamError, match=r"\(InfogainLoss\).*source"):
        make_layer("", [(2, 3), (2,)], type="InfogainLoss")


def test_error_missing_source_file(tmp_path):
    with pytest.raises(PrototxtError, match=r"layer 'layer' \(InfogainLoss\)"):
        make_layer(
            f'infogain_loss_param {{ source: "{tmp_path / "none"}" }}',
            [(2, 3), (2,)],
            type="InfogainLoss",
        )


def test_error_h_size():
    with pytest.raises(LayerParamError, match=r"\(InfogainLoss\).*3x3"):
        make_layer("", [(2, 3), (2,), (4, 4)], type="InfogainLoss")


def test_error_label_count():
    with pytest.raises(LayerParamError, match=r"\(InfogainLoss\).*labels"):
        make_layer("", [(2, 3, 2), (2,), (3, 3)], type="InfogainLoss")
