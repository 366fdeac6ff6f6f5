"""Registered means tested: every layer type has cases and golden coverage; generic checks.

In the way of PyTorch's ModuleInfo: each tests/layers/test_*.py module lists ``CASES``; this
file runs repr, a state_dict round trip, ``.double()`` and CPU/CUDA parity over all of them.
"""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path

import pytest
import torch

import torchcaffe
from tests.helpers.cases import LayerCase
from tests.helpers.harness import run

TESTS = Path(__file__).resolve().parent
GOLDEN = TESTS / "golden"

# Types with no case in the reference-Caffe golden set, and what guards them instead.
NO_GOLDEN = {
    "ConvolutionDepthwise": "fork alias of grouped Convolution; numpy reference tests",
    "DepthwiseConvolution": "fork alias of grouped Convolution; numpy reference tests",
    "Python": "runs user code; tested with pycaffe-style layers in test_python_layer.py",
    "ShuffleChannel": "ShuffleNet fork, not in the reference build; numpy port of its copy loop",
    "ROIPooling": "caffe-fast-rcnn fork; numpy ports of roi_pooling_layer.cpp and .cu backward",
    "PSROIPooling": "R-FCN fork, GPU-only there; numpy port of psroi_pooling_layer.cu",
    "Axpy": "SENet fork, not in the reference build; numpy axpy_layer.cpp tests",
    "BN": "PSPNet/SegNet forks, not in the reference build; numpy bn_layer.cpp tests",
    "Interp": "PSPNet/DeepLab fork, not in the reference build; numpy caffe_cpu_interp2 tests",
    "DenseImageData": "SegNet/ENet fork data layer, not in the reference build; OpenCV-based "
    "reference tests in test_dense_image_data.py",
    "WindowData": "no reference case (golden README: Not covered); numpy port of its warp "
    "in test_window_data.py",
    "AnnotatedData": "SSD fork data layer; the fork build has no OpenCV/LMDB (golden README); "
    "box-geometry and transform tests in test_annotated_data.py",
    "HDF5Output": "no reference case (golden README: Not covered); h5py round-trip tests",
}


@cache
def all_cases() -> list[LayerCase]:
    cases = []
    for path in sorted((TESTS / "layers").glob("test_*.py")):
        module = importlib.import_module(f"tests.layers.{path.stem}")
        cases.extend(getattr(module, "CASES", []))
    return cases


@cache
def golden_types() -> set[str]:
    types: set[str] = set()
    for proto in GOLDEN.glob("*/*/*.prototxt"):
        types.update(re.findall(r'type:\s*"(\w+)"', proto.read_text()))
    return types


@pytest.mark.parametrize("layer_type", torchcaffe.layer_type_list())
def test_registered_type_has_cases(layer_type):
    assert any(c.type == layer_type for c in all_cases()), (
        f"{layer_type} is registered but no tests/layers/test_*.py lists a LayerCase for it"
    )


@pytest.mark.parametrize("layer_type", torchcaffe.layer_type_list())
def test_registered_type_has_golden_coverage(layer_type):
    if layer_type in NO_GOLDEN:
        assert layer_type not in golden_types(), f"{layer_type} now has a golden case: unlist it"
        return
    assert layer_type in golden_types(), (
        f"{layer_type} has no golden case; add one or list it in NO_GOLDEN with a reason"
    )


def test_no_golden_list_names_only_registered_types():
    assert set(NO_GOLDEN) <= set(torchcaffe.layer_type_list())


def _as_float32(bottoms):
    return [b.float() if b.is_floating_point() else b for b in bottoms]


def _ids(cases):
    return [f"{c.type}-{i}" for i, c in enumerate(cases)]


CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_repr_names_the_layer(case):
    layer, _ = case.build()
    text = repr(layer)
    assert type(layer).__name__ in text


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_state_dict_round_trip(case):
    a, bottoms = case.build(seed=1)
    b, _ = case.build(seed=2)
    b.load_state_dict(a.state_dict())
    for x, y in zip(a.param_blobs(), b.param_blobs()):
        assert torch.equal(x, y)
    if not case.deterministic:
        return
    with torch.no_grad():
        for x, y in zip(run(a, bottoms), run(b, bottoms)):
            torch.testing.assert_close(x, y, equal_nan=True)


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_double_matches_float(case):
    layer, bottoms = case.build()
    if not case.deterministic or not bottoms:  # no bottom to carry the dtype (Input)
        return
    bottoms = _as_float32(bottoms)
    with torch.no_grad():
        want = run(layer, bottoms)
        layer = layer.double()
        got = run(layer, [b.double() if b.is_floating_point() else b for b in bottoms])
    for g, w in zip(got, want):
        if w.is_floating_point():
            assert g.dtype == torch.float64
            torch.testing.assert_close(g.float(), w, rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA parity needs a GPU")
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_cuda_matches_cpu(case):
    layer, bottoms = case.build()
    if not case.deterministic:
        return
    twin, _ = case.build()  # data layers advance their cursor: the twin starts where it did
    # in IEEE float32, as the nets run their layers on CUDA (under torch's defaults, which allow
    # TF32, a 3-D dilated Deconvolution was 3e-3 off on an H200; not yet rerun under IEEE)
    with torch.no_grad(), torchcaffe.caffe_float32():
        want = run(layer, bottoms)
        got = run(twin.cuda(), [b.cuda() for b in bottoms])
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-5, equal_nan=True)
