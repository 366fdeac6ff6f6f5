"""Accuracy: top-k with ties counted against the label, axis, ignore_label, per-class top."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe import runtime
from torchcaffe.errors import DataError, LayerParamError


def _scores_labels(shape, label_shape, classes):
    def make(g):
        return [
            torch.randn(shape, generator=g, dtype=torch.float64),
            torch.randint(0, classes, label_shape, generator=g).double(),
        ]

    return make


CASES = [
    LayerCase(
        "Accuracy",
        "",
        ((6, 5), (6,)),
        make_bottoms=_scores_labels((6, 5), (6,), 5),
        id="accuracy_top1",
    ),
    LayerCase(
        "Accuracy",
        "accuracy_param { top_k: 2 ignore_label: 1 }",
        ((2, 4, 3, 5), (2, 3, 5)),
        n_tops=2,
        make_bottoms=_scores_labels((2, 4, 3, 5), (2, 3, 5), 4),
        id="accuracy_spatial_topk_perclass",
    ),
    LayerCase(
        "Accuracy",
        "accuracy_param { axis: 2 }",
        ((2, 3, 4), (2, 3)),
        make_bottoms=_scores_labels((2, 3, 4), (2, 3), 4),
        id="accuracy_axis2",
    ),
]


def ref_accuracy(x, label, axis, top_k, ignore):
    """Caffe's AccuracyLayer::Forward_cpu loop: count scores >= the label's (itself included,
    starting from -1); correct when that count < top_k. Returns (accuracy, per_class)."""
    outer, c = int(np.prod(x.shape[:axis])), x.shape[axis]
    inner = int(np.prod(x.shape[axis + 1 :]))
    xs = x.reshape(outer, c, inner)
    lab = np.trunc(label.reshape(outer, inner)).astype(int)
    acc, count = 0, 0
    nums, hits = np.zeros(c), np.zeros(c)
    for i in range(outer):
        for j in range(inner):
            if ignore is not None and lab[i, j] == ignore:
                continue
            nums[lab[i, j]] += 1
            true = xs[i, lab[i, j], j]
            better = -1
            for k in range(c):
                if better >= top_k:
                    break
                better += xs[i, k, j] >= true
            if better < top_k:
                acc += 1
                hits[lab[i, j]] += 1
            count += 1
    per_class = np.where(nums == 0, 0, hits / np.maximum(nums, 1))
    return (0.0 if count == 0 else acc / count), per_class


def _run(snippet, x, label, n_tops=2):
    layer, _ = make_layer(
        snippet, [x.shape, label.shape], type="Accuracy", n_tops=n_tops, dtype=torch.float64
    )
    out = layer(torch.tensor(x), torch.tensor(label))
    return out if n_tops == 2 else (out,)


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("ignore", [None, 0, 3])
@pytest.mark.parametrize("axis", [1, 2, -1])
def test_forward_matches_reference(top_k, ignore, axis):
    rng = np.random.default_rng(top_k + 10 * (axis % 3))
    shape = (3, 4, 5)
    # few distinct values, so ties with the label's score are frequent
    x = rng.integers(0, 3, shape).astype(np.float64)
    lshape = tuple(d for i, d in enumerate(shape) if i != axis % 3)
    label = rng.integers(0, shape[axis], lshape).astype(np.float64)
    ign = "" if ignore is None else f"ignore_label: {ignore}"
    acc, per_class = _run(f"accuracy_param {{ top_k: {top_k} axis: {axis} {ign} }}", x, label)
    want_acc, want_per_class = ref_accuracy(x, label, axis % 3, top_k, ignore)
    assert float(acc) == pytest.approx(want_acc, rel=1e-12)
    np.testing.assert_allclose(per_class.numpy(), want_per_class, rtol=1e-12)
    assert acc.shape == () and per_class.shape == (shape[axis],)


def test_ties_count_against_the_label():
    x = np.array([[1.0, 1.0, 0.0], [2.0, 1.0, 1.0]])
    label = np.array([1.0, 0.0])  # sample 0 ties with class 0: not top-1; sample 1 is
    (acc,) = _run("", x, label, n_tops=1)
    assert float(acc) == 0.5
    (acc,) = _run("accuracy_param { top_k: 2 }", x, label, n_tops=1)
    assert float(acc) == 1.0


def test_all_ignored_gives_zero():
    acc, per_class = _run("accuracy_param { ignore_label: 1 }", np.ones((3, 2)), np.ones(3))
    assert float(acc) == 0.0 and not per_class.any()


def test_no_backward():
    layer, _ = make_layer("", [(3, 2), (3,)], type="Accuracy")
    assert layer.has_backward is False
    x = torch.randn(3, 2, requires_grad=True)
    assert not layer(x, torch.zeros(3)).requires_grad


def test_error_top_k_exceeds_classes():
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(Accuracy\).*top_k"):
        make_layer("accuracy_param { top_k: 4 }", [(2, 3), (2,)], type="Accuracy")


def test_error_top_k_exceeds_classes_of_a_later_bottom():
    # Caffe: AccuracyLayer::Reshape checks top_k on every reshape, not only at setup
    layer, _ = make_layer("accuracy_param { top_k: 3 }", [(2, 5), (2,)], type="Accuracy")
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(Accuracy\).*top_k"):
        layer(torch.randn(4, 2), torch.zeros(4))


def test_error_label_count():
    with pytest.raises(LayerParamError, match=r"layer 'layer' \(Accuracy\).*labels"):
        make_layer("accuracy_param { axis: 2 }", [(2, 3, 4), (2, 4)], type="Accuracy")


def test_error_label_out_of_range(monkeypatch):
    monkeypatch.setattr(runtime, "_check_labels", True)  # opt-in: it syncs with the device
    with pytest.raises(DataError, match=r"layer 'layer' \(Accuracy\).*label"):
        _run("", np.zeros((2, 3)), np.array([0.0, 3.0]))
