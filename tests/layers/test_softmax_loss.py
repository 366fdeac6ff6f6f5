"""SoftmaxWithLoss: -log(max(softmax, FLT_MIN)) at the label over the normalizer, ignore_label,
legacy normalize, the probability top, and Caffe's gradient (prob - onehot) * lw / normalizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe import runtime
from torchcaffe.errors import DataError, LayerParamError

FLT_MIN = float(np.finfo(np.float32).tiny)


def _scores_labels(shape, axis):
    def make(g):
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
        lshape = shape[:axis] + shape[axis + 1 :]
        lab = torch.randint(0, shape[axis], lshape, generator=g).double()
        return [x, lab]

    return make


CASES = [
    LayerCase(
        "SoftmaxWithLoss",
        "",
        ((3, 4, 2, 5), (3, 1, 2, 5)),
        make_bottoms=lambda g: [
            torch.randn(3, 4, 2, 5, generator=g, dtype=torch.float64),
            torch.randint(0, 4, (3, 1, 2, 5), generator=g).double(),
        ],
        id="swl_default",
    ),
    LayerCase(
        "SoftmaxWithLoss",
        "softmax_param { axis: 2 } loss_param { ignore_label: 1 }",
        ((2, 3, 4, 5), (2, 3, 5)),
        make_bottoms=_scores_labels((2, 3, 4, 5), 2),
        id="swl_axis2_ignore",
    ),
    LayerCase(
        "SoftmaxWithLoss",
        "loss_param { normalization: BATCH_SIZE }",
        ((5, 3), (5,)),
        n_tops=2,
        make_bottoms=_scores_labels((5, 3), 1),
        id="swl_prob_top",
    ),
    LayerCase(
        "SoftmaxWithLoss",
        "loss_param { normalize: false }",
        ((4, 6), (4,)),
        make_bottoms=_scores_labels((4, 6), 1),
        id="swl_normalize_false",
    ),
]


def ref_swl(x, label, axis, ignore, mode):
    """Caffe's Forward/Backward_cpu loops: returns (loss, bottom diff for top diff 1)."""
    outer, c = int(np.prod(x.shape[:axis])), x.shape[axis]
    inner = int(np.prod(x.shape[axis + 1 :]))
    xs = x.reshape(outer, c, inner)
    e = np.exp(xs - xs.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    lab = np.trunc(label.reshape(outer, inner)).astype(int)
    loss, count, diff = 0.0, 0, p.copy()
    for i in range(outer):
        for j in range(inner):
            if ignore is not None and lab[i, j] == ignore:
                diff[i, :, j] = 0
                continue
            loss -= np.log(max(p[i, lab[i, j], j], FLT_MIN))
            diff[i, lab[i, j], j] -= 1
            count += 1
    norm = {"FULL": outer * inner, "VALID": count, "BATCH_SIZE": outer, "NONE": 1}[mode]
    norm = max(1.0, norm)
    return loss / norm, (diff / norm).reshape(x.shape)


def _run(snippet, x, label, n_tops=1, top_diff=1.0):
    layer, _ = make_layer(
        snippet, [x.shape, label.shape], type="SoftmaxWithLoss", n_tops=n_tops, dtype=torch.float64
    )
    xt = torch.tensor(x, requires_grad=True)
    out = layer(xt, torch.tensor(label))
    loss = out[0] if n_tops == 2 else out
    loss.backward(torch.tensor(top_diff, dtype=torch.float64))
    return out, xt.grad.numpy()


@pytest.mark.parametrize(
    "loss_param,mode",
    [
        ("", "VALID"),
        ("normalization: FULL", "FULL"),
        ("normalization: VALID", "VALID"),
        ("normalization: BATCH_SIZE", "BATCH_SIZE"),
        ("normalization: NONE", "NONE"),
        ("normalize: true", "VALID"),
        ("normalize: false", "BATCH_SIZE"),
        ("normalize: false normalization: FULL", "FULL"),  # normalization wins when set
    ],
)
@pytest.mark.parametrize("ignore", [None, 2, -1])
def test_forward_backward_normalization_ignore(loss_param, mode, ignore):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 2, 5)) * 3
    label = rng.integers(0, 4, (3, 2, 5)).astype(np.float64)
    label[0, 0, :2] = 0 if ignore is None else ignore
    ign = "" if ignore is None else f"ignore_label: {ignore}"
    lw = 2.5
    loss, dx = _run(f"loss_param {{ {loss_param} {ign} }}", x, label, top_diff=lw)
    want_loss, want_dx = ref_swl(x, label, 1, ignore, mode)
    np.testing.assert_allclose(float(loss.detach()), want_loss, rtol=1e-12)
    np.testing.assert_allclose(dx, lw * want_dx, rtol=1e-10, atol=1e-14)


def test_forward_axis2_label_layout():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 4, 5))
    label = rng.integers(0, 4, (2, 3, 5)).astype(np.float64)
    loss, dx = _run("softmax_param { axis: 2 }", x, label)
    want_loss, want_dx = ref_swl(x, label, 2, None, "VALID")
    np.testing.assert_allclose(float(loss.detach()), want_loss, rtol=1e-12)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-10, atol=1e-14)


def test_clamp_forward_and_caffe_gradient_ignore_it():
    x = np.array([[0.0, 200.0, -200.0], [1.0, 2.0, 3.0]])
    label = np.array([2.0, 0.0])  # sample 0: prob of the label underflows below FLT_MIN
    loss, dx = _run("", x, label)
    want_loss, want_dx = ref_swl(x, label, 1, None, "VALID")
    assert want_loss == pytest.approx(
        (-np.log(FLT_MIN) + -np.log(np.exp(1) / np.exp([1, 2, 3]).sum())) / 2
    )
    np.testing.assert_allclose(float(loss.detach()), want_loss, rtol=1e-12)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-10, atol=1e-14)
    assert dx[0, 2] == pytest.approx(-0.5)  # (0 - 1) / 2: the clamp does not stop it


def test_a_float16_net_keeps_the_clamp_of_a_confident_miss():
    """In float16 the label's probability (e**-30) and FLT_MIN are both 0: the loss is
    computed in float32, as Caffe's float one, and rounded once (not -log(0) = inf)."""
    layer, _ = make_layer("", [(2, 3), (2,)], type="SoftmaxWithLoss")
    x = torch.tensor([[0.0, 30.0, 0.0], [1.0, 2.0, 3.0]])
    label = torch.tensor([2.0, 0.0])
    want = layer(x, label)
    x16 = x.half().requires_grad_()
    loss = layer.half()(x16, label.half())
    assert loss.dtype == torch.float16
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-3)
    loss.backward()
    assert x16.grad is not None and bool(torch.isfinite(x16.grad).all())


def test_all_ignored_gives_zero_loss_and_gradient():
    x = np.random.default_rng(1).standard_normal((3, 4))
    label = np.full((3,), 2.0)
    loss, dx = _run("loss_param { ignore_label: 2 }", x, label)
    assert float(loss.detach()) == 0.0
    assert not dx.any()


def test_second_top_is_probability_without_gradient():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3, 2))
    label = rng.integers(0, 3, (4, 2)).astype(np.float64)
    (loss, prob), dx = _run("", x, label, n_tops=2)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(prob.numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-12)
    assert not prob.requires_grad
    np.testing.assert_allclose(dx, ref_swl(x, label, 1, None, "VALID")[1], rtol=1e-10)


@pytest.mark.parametrize("bad", [3.0, -1.0])
def test_error_label_out_of_range(bad, monkeypatch):
    monkeypatch.setattr(runtime, "_check_labels", True)  # opt-in: it syncs with the device
    x = np.zeros((2, 3))
    with pytest.raises(DataError, match=r"layer 'layer' \(SoftmaxWithLoss\).*label"):
        _run("", x, np.array([0.0, bad]))


def test_error_label_count():
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(SoftmaxWithLoss\).*labels"):
        make_layer("", [(2, 3, 4), (2, 3)], type="SoftmaxWithLoss")


def test_error_first_dimension():
    with pytest.raises(LayerParamError, match=r"\(SoftmaxWithLoss\).*first dimension"):
        make_layer("softmax_param { axis: 0 }", [(4, 3), (3,)], type="SoftmaxWithLoss")


def test_error_axis_out_of_range():
    with pytest.raises(LayerParamError, match=r"\(SoftmaxWithLoss\).*softmax_param.axis"):
        make_layer("softmax_param { axis: 2 }", [(4, 3), (4,)], type="SoftmaxWithLoss")


def test_output_shapes_and_label_no_force_backward():
    layer, _ = make_layer("", [(4, 3, 2), (4, 2)], type="SoftmaxWithLoss", n_tops=2)
    assert layer.output_shapes([(4, 3, 2), (4, 2)]) == [(), (4, 3, 2)]
    assert layer.is_loss and not layer.allow_force_backward(1)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    # top 0 only: Caffe (and this layer) give the probability top no gradient
    check_layer_gradient(layer, bottoms, bottom_indices=[0], top_index=(0, 0), max_points=60)


@pytest.mark.parametrize(
    "loss_type,shapes",
    [
        ("SoftmaxWithLoss", [(2, 3), (2,)]),
        ("Accuracy", [(2, 3), (2,)]),
        ("InfogainLoss", [(2, 3), (2,), (3, 3)]),
        ("MultinomialLogisticLoss", [(2, 3), (2,)]),
        ("HingeLoss", [(2, 3), (2,)]),
    ],
)
@pytest.mark.parametrize("bad", [3.0, -1.0, float("nan")])
def test_a_label_out_of_range_is_a_clear_error_on_the_cpu(loss_type, shapes, bad):
    """On the CPU the check is a compare, no sync: it always runs (torch's indexing would
    raise its own bare error, or HingeLoss read another sample's score). Off the CPU it is
    opt-in (``check_labels`` on meta, where it would sync on a device, checks nothing)."""
    layer, (scores, _, *infogain) = make_layer("", shapes, type=loss_type)
    labels = torch.tensor([0.0, bad])
    with pytest.raises(DataError, match=r"label value out of range; expected integers in \[0, 3\)"):
        layer(scores, labels, *infogain)
    from torchcaffe.ops._loss_normalization import check_labels

    assert not runtime.label_range_checks()  # default: no host sync off the CPU
    check_labels(layer, labels.to("meta"), None, 3)


@pytest.mark.parametrize("loss_type", ["SoftmaxWithLoss", "InfogainLoss"])
def test_a_float16_net_sums_many_labels_in_float32(loss_type):
    """300x300 labels: in float16 both the summed loss and the VALID count pass 65504 (inf,
    then NaN); Caffe's float loss is finite, and so is ours, rounded once."""
    param = "loss_param { ignore_label: 255 }"
    if loss_type == "InfogainLoss":
        param += " infogain_loss_param { axis: 1 }"
    shapes = [(1, 3, 300, 300), (1, 1, 300, 300)]
    if loss_type == "InfogainLoss":
        shapes.append((1, 1, 3, 3))
    layer, _ = make_layer(param, shapes, type=loss_type)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shapes[0], generator=gen)
    label = torch.randint(0, 3, shapes[1], generator=gen).float()
    extra = [torch.eye(3).reshape(shapes[2])] if loss_type == "InfogainLoss" else []
    want = layer(x, label, *extra)
    got = layer.half()(x.half(), label.half(), *[e.half() for e in extra])
    assert got.dtype == torch.float16
    assert float(got) == pytest.approx(float(want), rel=1e-3)


def test_a_float16_sigmoid_cross_entropy_sums_in_float32():
    layer, _ = make_layer(
        "loss_param { normalization: VALID ignore_label: -1 }",
        [(1, 90000), (1, 90000)],
        type="SigmoidCrossEntropyLoss",
    )
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 90000, generator=gen)
    target = torch.randint(0, 2, (1, 90000), generator=gen).float()
    want = layer(x, target)
    got = layer.half()(x.half(), target.half())
    assert got.dtype == torch.float16
    assert float(got) == pytest.approx(float(want), rel=1e-3)
