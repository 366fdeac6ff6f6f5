"""Filter: keep the items whose selector (last bottom) is nonzero, for every data bottom;
setup-time shapes keep all items; zero gradient for dropped items, none for the selector."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError, LayerParamError


def _with_selector(shapes, selector):
    return lambda g: (
        [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
        + [torch.tensor(selector, dtype=torch.float64).reshape(len(selector), -1)[:, 0]]
    )


CASES = [
    LayerCase(
        "Filter",
        "",
        ((5, 3, 2), (5, 4), (5,)),
        n_tops=2,
        make_bottoms=_with_selector([(5, 3, 2), (5, 4)], [1, 0, 1, 1, 0]),
    ),
    LayerCase("Filter", "", ((4, 3), (4,)), make_bottoms=_with_selector([(4, 3)], [0, 2, 0, -1])),
]


def ref_filter(arrays, selector, top_diffs):
    """Caffe: items n with selector[n] != 0, in order; backward copies their diffs back and
    zeroes the rest."""
    keep = [n for n, s in enumerate(selector) if s != 0]
    tops = [a[keep] for a in arrays]
    diffs = []
    for a, d in zip(arrays, top_diffs):
        full = np.zeros_like(a)
        full[keep] = d
        diffs.append(full)
    return tops, diffs


@pytest.mark.parametrize(
    "shapes,selector_shape,selector",
    [
        (((5, 3, 2), (5, 4)), (5,), [1, 0, 1, 1, 0]),
        (((4, 3),), (4, 1, 1), [0, 2.5, 0, -1]),
        (((3, 2),), (3,), [0, 0, 0]),
        (((3, 2), (3,)), (3, 1), [1, 1, 1]),
    ],
)
def test_forward_backward_match_caffe(shapes, selector_shape, selector):
    gen = torch.Generator().manual_seed(4)
    xs = [torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes]
    sel = torch.tensor(selector, dtype=torch.float64).reshape(selector_shape)
    layer, _ = make_layer(
        "",
        [*shapes, selector_shape],
        type="Filter",
        n_tops=len(shapes),
        bottoms=[*(x.detach() for x in xs), sel],
        dtype=torch.float64,
    )
    assert layer.output_shapes([*shapes, selector_shape]) == list(shapes)
    tops = layer(*xs, sel)
    tops = tops if isinstance(tops, tuple) else (tops,)
    rng = np.random.default_rng(0)
    top_diffs = [rng.standard_normal(t.shape) for t in tops]
    want, want_diffs = ref_filter([x.detach().numpy() for x in xs], selector, top_diffs)
    for t, w in zip(tops, want):
        np.testing.assert_array_equal(t.detach().numpy(), w)
    torch.autograd.backward(tops, [torch.tensor(d) for d in top_diffs])
    for x, w in zip(xs, want_diffs):
        np.testing.assert_array_equal(x.grad.numpy(), w)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms, bottom_indices=range(len(bottoms) - 1))


def test_selector_is_forced_and_refused():
    # Caffe's Filter keeps Layer's AllowForceBackward (true); its Backward aborts when asked
    # for the selector diff ("Layer cannot backpropagate to filter index inputs")
    layer, _ = CASES[0].build()
    assert [layer.allow_force_backward(i) for i in range(3)] == [True, True, True]
    assert layer.backward_refusal([True, True, False], ["a", "b", "s"]) is None
    assert layer.backward_refusal([True, False, True], ["a", "b", "s"])


@pytest.mark.parametrize(
    "shapes,field",
    [
        (((5, 3), (5, 2)), "singleton"),
        (((5, 3), (4,)), "first dimension"),
    ],
)
def test_error(shapes, field):
    with pytest.raises(LayerParamError, match=rf"layer 'f1' \(Filter\).*{field}"):
        make_layer("", shapes, type="Filter", name="f1")


def test_error_top_count():
    with pytest.raises(BlobWiringError, match=r"layer 'f1' \(Filter\).*top"):
        make_layer("", [(5, 3), (5, 2), (5,)], type="Filter", n_tops=1, name="f1")
