"""c_div and ConvGeometry.extra_pad: the zeros after each axis that make torch's floor rounding give
Caffe's output size. It runs on every convolution forward, so the usual case (no axis with
in + 2 * pad < extent) returns before computing output sizes; it must equal the formula."""

from __future__ import annotations

import itertools

import pytest
import torch

from torchcaffe.ops import _conv_spec
from torchcaffe.ops._conv_geometry import ConvGeometry, c_div


def _formula(g: ConvGeometry, spatial: tuple[int, ...]) -> tuple[int, ...]:
    out = g.conv_output(spatial)
    return tuple(
        max(0, (o - 1) * s + e - (i + 2 * p))
        for o, s, e, i, p in zip(out, g.stride, g.extent, spatial, g.pad)
    )


GEOMETRIES = [
    ConvGeometry(1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ConvGeometry(1, (5, 3), (2, 1), (0, 1), (1, 2)),
    ConvGeometry(1, (7,), (3,), (2,), (1,)),
    ConvGeometry(1, (2, 4, 3), (1, 3, 2), (0, 1, 2), (2, 1, 1)),
]


@pytest.mark.parametrize("g", GEOMETRIES)
def test_extra_pad_equals_the_formula(g):
    for spatial in itertools.product(range(1, 12), repeat=g.num_spatial):
        if all(o > 0 for o in g.conv_output(spatial)):  # sizes set-up accepts
            assert g.extra_pad(spatial) == _formula(g, spatial), spatial


def test_extra_pad_skips_output_sizes_when_no_axis_is_short(monkeypatch):
    g = ConvGeometry(1, (5, 3), (2, 1), (0, 1), (1, 2))  # extents (5, 5)
    assert g.extra_pad((4, 3)) == (1, 0)  # 4 + 0 < 5: Caffe's one output needs a zero

    def fail(spec, spatial):
        raise AssertionError("conv_output computed on the fast path")

    monkeypatch.setattr(_conv_spec, "spec_conv_output", fail)
    assert g.extra_pad((5, 3)) == (0, 0)
    assert g.extra_pad((9, 8)) == (0, 0)
    with pytest.raises(AssertionError):
        g.extra_pad((4, 3))


def test_c_div_truncates_toward_zero_without_torch_ops_on_plain_ints(monkeypatch):
    # dynamo before torch 2.13 broke the graph on torch.sym_max of two ints (18 breaks in
    # ResNet-50 on torch 2.11): plain sizes take builtin arithmetic
    def refuse(*args):
        raise AssertionError(f"torch.sym_max{args} on plain ints")

    monkeypatch.setattr(torch, "sym_max", refuse)
    assert [c_div(a, b) for a, b in [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 3), (-1, 3)]] == [
        3,
        -3,
        -3,
        3,
        0,
        0,
    ]


def test_geometry_pickles_and_reads_a_pickle_from_before_its_slots():
    """ConvGeometry has __slots__ (dynamo guards an instance dict on every compiled call); a
    net pickled before then holds its fields as a dict, without ``extent``. Python 3.11's
    slotted dataclass would read that dict's keys as the field values."""
    import pickle

    geom = ConvGeometry(1, (3, 3), (2, 1), (1, 0), (2, 1))
    assert geom.extent == (5, 3)
    again = pickle.loads(pickle.dumps(geom))
    assert again == geom and again.extent == (5, 3)
    old = object.__new__(ConvGeometry)
    old.__setstate__(
        {"channel_axis": 1, "kernel": (3, 3), "stride": (2, 1), "pad": (1, 0), "dilation": (2, 1)}
    )
    assert old == geom and old.extent == (5, 3)


@pytest.mark.parametrize("hint, want", [(10, 3), (2, 0)])  # (10 - 3) / 2 and (2 - 3) / 2
def test_c_div_of_a_symbolic_size_guards_its_sign_and_stays_a_floor_division(hint, want):
    """A Max per division nested through every later size, in the shapes the opaque
    convolution op reports (compiling ResNet-50 with a dynamic channels_last input: > 15 min)."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    size = env.create_symintnode(env.create_symbol(hint, ConstantSource("h")), hint=hint)
    got = c_div(size - 3, 2)
    assert "Max" not in str(got) and len(env.guards) == 1
    assert got.node.hint == want


def test_c_div_of_a_data_dependent_size_divides_without_a_guard():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    got = c_div(env.create_unbacked_symint() - 3, 2)
    assert "Max" in str(got) and not env.guards
