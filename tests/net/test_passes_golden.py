"""Golden cases through the torch face with every inference pass on.

The conformance suite runs cases through the Caffe face, where every blob is observable (only
in-place chains fold). Here each deterministic layers/ and nets/ case runs as ``net(**inputs)``
under ``inference_mode``: only the net's outputs are observable, so every legal fold happens.
The outputs are compared with the reference Caffe's at the case's own tolerance (TRAIN-phase
cases too: there BatchNorm uses batch statistics, so only the in-place passes apply).
Each case runs twice more with the layout pass's thresholds at zero, so that every
convolution, and every layer after one, runs on channels_last tensors, and with
onednn_linear.MIN_WEIGHTS at zero, so that every InnerProduct runs on oneDNN, and once
with the program a run off the CPU takes (``direct_calls``), on CPU tensors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchcaffe
from tests.helpers.compare import assert_blob_close
from tests.helpers.golden import InFolder, discover
from tests.helpers.programs import off_cpu_programs
from tests.test_conformance import xfail_reason
from torchcaffe.net.passes import layout
from torchcaffe.ops import onednn_linear

ROOT = Path(__file__).resolve().parents[1] / "golden"
CASES = [
    c
    for c in discover(ROOT)
    if c.group in ("layers", "nets")
    and c.meta.get("deterministic", True)
    and xfail_reason(c.id) is None
    and (c.path / "net.prototxt").exists()
]


def _build(case):
    weights = case.path / "weights.caffemodel"
    net = torchcaffe.load(
        case.path / "net.prototxt",
        weights if weights.exists() else None,
        phase=case.meta["phase"].lower(),
    )
    arrays = case.arrays()
    inputs = {k[3:]: torch.from_numpy(v) for k, v in arrays.items() if k.startswith("in/")}
    return net, arrays, _without_parameter_tops(net, inputs)


def _without_parameter_tops(net, inputs):
    """``inputs`` less the blobs a Parameter layer makes: the case records them as inputs, but
    the net takes them from the weights file, which must hold the same values (their diffs
    are the cases' ``paramdiff/<layer>/0``)."""
    kept = dict(inputs)
    for step in net.steps:
        if step.type == "Parameter" and step.tops[0] in kept:
            value = kept.pop(step.tops[0])
            weight = net.module_of(step).param_blobs()[0].detach()
            assert torch.equal(weight, value), f"Parameter {step.name}: weights differ from in/"
    return kept


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden_outputs_with_passes_on(case, monkeypatch):
    with InFolder(case.path):
        net, arrays, inputs = _build(case)
        if set(inputs) != set(net.input_names):
            pytest.xfail("inputs are not the net's input blobs (data layers)")
        runs = _runs(net, inputs, case.meta["phase"])
        monkeypatch.setattr(layout, "MIN_PIXELS", 0)
        monkeypatch.setattr(onednn_linear, "MIN_WEIGHTS", 0)
        net._programs.clear()  # rebuilt under the patched thresholds
        runs += _runs(net, inputs, case.meta["phase"])
        off_cpu_programs(monkeypatch, net)  # a GPU's program (direct calls), on the CPU
        runs += _runs(net, inputs, case.meta["phase"])
    rtol, atol = case.meta["rtol"], case.meta["atol"]
    for got in runs:
        for name, value in got.items():
            if f"out/{name}" in arrays:
                want = arrays[f"out/{name}"]
                assert_blob_close(f"out/{name}", value.detach().numpy(), want, rtol, atol)


def _runs(net, inputs, phase):
    with torch.inference_mode():
        runs = [net(**inputs)]
        if phase == "TEST":  # every blob observable, as on the Caffe face
            runs.append(net.forward_all_blobs(**inputs))
    return runs


def test_every_pass_fires_on_some_golden_net():
    fired: dict[str, int] = {}
    off_cpu: dict[str, int] = {}  # the programs for a GPU
    meta = torch.device("meta")
    for case in CASES:
        with InFolder(case.path):
            try:
                net, _, _ = _build(case)
            except torchcaffe.TorchCaffeError:
                continue
        for seen in (net.output_names, net.blob_names):  # torch face, and every blob kept
            for name, count in net.optimized_program(seen).report.items():
                fired[name] = fired.get(name, 0) + count
        for program in (net.optimized_program(device=meta), net.training_program(device=meta)):
            for name, count in program.report.items():
                off_cpu[name] = off_cpu.get(name, 0) + count
    # No golden net has a BatchNorm whose input blob stays observable, so
    # fold_batchnorm_into_scale is exercised by tests/net/test_passes.py only.
    assert fired["fold_batchnorm_scale_into_producer"] and fired["inplace_relu"], fired
    assert fired["channels_last_layout"], fired
    assert off_cpu["direct_calls"] and off_cpu["direct_calls_for_training"], off_cpu
