"""Golden cases with backward through the torch face, with every training pass on.

The conformance suite runs backward through the Caffe face. Here each deterministic layers/ and
nets/ case with a backward runs as ``net(**inputs)`` with autograd recording, so only the net's
outputs are observable and every legal training pass fires (BatchNorm + Scale fused, Splits
bypassed, ReLUs in place). The objective is Caffe's: each loss top times its weight plus each
recorded top diff times its output (a recorded diff replaces the weight, as in the
cases). Param diffs, input diffs and updated statistics are
compared with the reference Caffe's at the case's own tolerance.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.compare import assert_blob_close
from tests.helpers.golden import InFolder, discover
from tests.helpers.programs import off_cpu_programs
from tests.net.test_passes_golden import ROOT, _build
from tests.test_conformance import xfail_reason
from torchcaffe.ops import onednn_linear

CASES = [
    c
    for c in discover(ROOT)
    if c.group in ("layers", "nets")
    and c.meta.get("deterministic", True)
    and c.meta["backward"]
    and xfail_reason(c.id) is None
    and (c.path / "net.prototxt").exists()
]


def _objective(net, outputs, arrays) -> torch.Tensor | None:
    """Caffe's backward seed: a recorded top diff, else the top's loss weight."""
    diffs = {k[8:]: torch.from_numpy(v) for k, v in arrays.items() if k.startswith("topdiff/")}
    terms = [(outputs[name] * diff).sum() for name, diff in diffs.items()]
    terms += [w * outputs[n].sum() for n, w in net.loss_weights().items() if n not in diffs]
    return torch.stack(terms).sum() if terms else None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden_diffs_with_training_passes_on(case, monkeypatch):
    net = _check(case)
    if any(s.type == "InnerProduct" for s in net.steps):
        # again with every InnerProduct on oneDNN, not only those of 2^18 weights
        monkeypatch.setattr(onednn_linear, "MIN_WEIGHTS", 0)
        _check(case)
    if any(s.type in ("Convolution", "InnerProduct") for s in net.steps):
        # again with the program a run off the CPU takes (direct products), on CPU tensors
        off_cpu_programs(monkeypatch)
        _check(case)


def _check(case):
    """Run ``case`` forward and backward on a fresh net, compare with Caffe; returns the net."""
    with InFolder(case.path):
        net, arrays, inputs = _build(case)
        if set(inputs) != set(net.input_names):
            pytest.xfail("inputs are not the net's input blobs (data layers)")
        if not set(net.loss_weights()) <= set(net.output_names):
            pytest.xfail("a loss-weighted blob is not a net output")
        for x in inputs.values():
            x.requires_grad_(x.is_floating_point())
        objective = _objective(net, net(**inputs), arrays)
        if objective is not None:
            objective.backward()
    assert net.training_program().report  # the training program ran
    rtol, atol = case.meta["rtol"], case.meta["atol"]
    for key, want in arrays.items():
        kind, _, rest = key.partition("/")
        if kind == "diff" and rest in inputs and inputs[rest].requires_grad:
            grad = inputs[rest].grad  # None: no gradient reaches it (Caffe's diff stays 0)
            got = torch.zeros_like(inputs[rest]) if grad is None else grad
            assert_blob_close(key, got.detach().numpy(), want, rtol, atol)
        elif kind in ("paramdiff", "paramafter"):
            layer, index = rest.split("/")
            blob = net.layer(layer).param_blobs()[int(index)]
            if kind == "paramafter":
                assert_blob_close(key, blob.detach().numpy(), want, rtol, atol)
            elif blob.requires_grad:
                got = torch.zeros_like(blob) if blob.grad is None else blob.grad
                assert_blob_close(key, got.numpy(), want, rtol, atol)
    return net
