"""Every golden net fed by Input blobs as one graph: torch.export with a dynamic batch
(``export_net``) and torch.compile with ``fullgraph=True``.

Each net of ``tests/golden`` (layers/, forks/, nets/) that its ``in/`` arrays feed is loaded
in TEST phase. Exported with a dynamic batch, the program must equal the eager net at the
example's batch and at twice it (the symbolic inputs doubled, the fixed ones as they are),
or, for the nets listed in ``REFUSED``, refuse with an ``ExportError`` that says why.
Compiled whole (dynamo's graph, run by its ``eager`` backend: graph breaks are what this
checks), it must equal the eager net, except the nets in ``DATA_DEPENDENT``. Run under
autograd, an exported program's backward must give the eager net's gradients, except where
torch.export cannot keep Caffe's own backward (``EXPORT_KEEPS_NO_BACKWARD``). A case that
starts to pass must leave its list; one that starts to fail must join it. The cases with a
backward also train compiled (``TRAINED``): a forward and backward in their own phase give
the eager outputs and gradients.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

from torchcaffe.errors import ExportError, UnsupportedError
from torchcaffe.net.export import batch_groups, export_net

from ..helpers.golden import (
    RECURRENT_NETS,
    InFolder,
    case_inputs,
    case_net,
    input_fed_cases,
    twice_the_batch,
)
from ..helpers.graphs import functions_returning_writes

GOLDEN = Path(__file__).resolve().parents[1] / "golden"

# case -> why no dynamic batch exists (each raises ExportError, naming the layer where it can)
REFUSED = {
    **dict.fromkeys(
        RECURRENT_NETS, "axis 0 is the timesteps, which the unrolled net fixes at set-up"
    ),
    "layers/lstm_unit": "c_prev's axis 0 must be 1",
    "layers/scale_2bottoms_axis0_bias": "the learned bias blob has the batch's size",
    "layers/slice_axis0_equal": "equal parts of axis 0 need a multiple of the part count",
    "forks/detection_evaluate": "its top's size is the number of detections",
    "forks/detection_output_corner_nonshared": "its top's size depends on the values",
    "forks/detection_output_ssd": "its top's size depends on the values",
    "forks/proposal_rpn": "its top's size depends on the values",
}

# case -> why its exported program's backward is not Caffe's. torch.export inlines an
# autograd.Function's forward and keeps no custom backward, so through a program a layer
# whose Caffe gradient differs from the mathematical one (ops/_functional) gets autograd's
EXPORT_KEEPS_NO_BACKWARD = {
    "forks/normalize_channelwise": "Normalize's per-channel scale multiplies Caffe's whole "
    "bottom diff (ops/_functional/normalize.py)",
    "forks/normalize_spatial_channelwise_eps": "as normalize_channelwise",
}

CASES = [pytest.param(c, id=c.id) for c in input_fed_cases(GOLDEN)]
# nets whose tops' sizes depend on the values: dynamo cannot hold them in one graph
DATA_DEPENDENT = {
    "forks/detection_evaluate",
    "forks/detection_output_corner_nonshared",
    "forks/detection_output_ssd",
    "forks/proposal_rpn",
}


def test_the_cases_cover_the_catalogue():
    assert len(CASES) >= 150
    assert {c.values[0].id for c in CASES} >= set(REFUSED)


@pytest.mark.parametrize("case", CASES)
def test_golden_net_exports_with_a_dynamic_batch(case):
    with InFolder(case.path):
        net = case_net(case).eval()
        inputs = case_inputs(case)
        if case.id in REFUSED:
            with pytest.raises(ExportError, match="dynamic batch|torch.export failed"):
                export_net(net, inputs)
            return
        program = export_net(net, inputs)
        if all(v.dim() and v.shape[0] == 1 for v in inputs.values()):
            inputs = {k: torch.cat([v, v]) for k, v in inputs.items()}  # as export_net traces
        symbolic = batch_groups(net, {k: tuple(v.shape) for k, v in inputs.items()})
        for factor in (1, 2):
            x = twice_the_batch(inputs, symbolic) if factor == 2 else inputs
            with torch.no_grad():
                want = net(**x)
                got = program.module()(*[x[n] for n in net.input_names])
            assert got.keys() == want.keys()
            for name, value in want.items():
                torch.testing.assert_close(
                    got[name], value, rtol=1e-4, atol=1e-5, equal_nan=True, msg=f"{name} x{factor}"
                )


def _gradients(outputs: dict, sources: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """Gradients of a fixed random weighting of the float outputs that autograd recorded."""
    gen = torch.Generator().manual_seed(0)
    recorded = [v for _, v in sorted(outputs.items()) if v.is_floating_point() and v.requires_grad]
    total = sum((v * torch.randn(v.shape, generator=gen)).sum() for v in recorded)
    return list(torch.autograd.grad(total, sources, allow_unused=True)) if recorded else []


BACKWARD_CASES = [
    pytest.param(
        *p.values,
        id=p.id,
        marks=pytest.mark.xfail(strict=True, reason=EXPORT_KEEPS_NO_BACKWARD[p.id]),
    )
    if p.id in EXPORT_KEEPS_NO_BACKWARD
    else p
    for p in CASES
    if p.id not in REFUSED
]


@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_exported_program_backpropagates_the_nets_gradients(case):
    """The exported program run under autograd, as a user calls it: it must run (an LRN's
    inference form once wrote out= there) and give the net's gradients."""
    with InFolder(case.path):
        net = case_net(case).eval()
        inputs = case_inputs(case)
        module = export_net(net, inputs).module()
        fed = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
        sources = [v for v in fed.values() if v.requires_grad]
        sources += [p for p in net.parameters() if p.requires_grad]  # the program's own
        got = _gradients(module(*[fed[n] for n in net.input_names]), sources)
        want = _gradients(net(**fed), sources)
    differs = [
        i
        for i, (g, w) in enumerate(zip(got, want))
        if (g is None) != (w is None)
        or (g is not None and not torch.allclose(g, w, rtol=1e-4, atol=1e-5, equal_nan=True))
    ]
    assert not differs, f"gradients {differs} of {len(sources)} differ"


@pytest.mark.parametrize("case", [p for p in CASES if p.id in DATA_DEPENDENT])
def test_jit_trace_refuses_a_layer_whose_tops_size_depends_on_the_values(case):
    """A trace kept the example's loops: traced, a DetectionOutput net gave another input
    the example's 60 detections where the net gave 59, or failed inside torch (Proposal's
    NMS: an internal assert in TorchScript's alias analysis)."""
    with InFolder(case.path):
        net = case_net(case).eval()
        inputs = tuple(case_inputs(case)[n] for n in net.input_names)
        with pytest.raises(UnsupportedError, match="jit.trace cannot record.*depend on the"):
            torch.jit.trace(net, inputs, strict=False, check_trace=False)


COMPILE_CASES = [
    pytest.param(
        *p.values,
        id=p.id,
        marks=pytest.mark.xfail(strict=True, reason="a top whose size depends on the values"),
    )
    if p.id in DATA_DEPENDENT
    else p
    for p in CASES
]


@pytest.mark.parametrize("case", COMPILE_CASES)
def test_golden_net_compiles_as_one_graph(case):
    with InFolder(case.path):
        net = case_net(case).eval()
        inputs = case_inputs(case)
        torch._dynamo.reset()
        compiled = torch.compile(net, backend="eager", fullgraph=True)
        with torch.no_grad():
            want, got = net(**inputs), compiled(**inputs)
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-5, equal_nan=True)


# forward + backward compiled: the nets/ cases and every fourth other case that has a
# backward, all of them with TORCHCAFFE_SLOW=1 (dynamo's graphs, with autograd's traced by
# aot_eager, about 0.4 s each)
TRAINED = [
    c
    for c in input_fed_cases(GOLDEN)
    if c.meta.get("backward") and c.meta.get("deterministic", True) is not False
]
TRAINED = [
    pytest.param(c, id=c.id)
    for i, c in enumerate(TRAINED)
    if os.environ.get("TORCHCAFFE_SLOW") == "1" or c.group == "nets" or i % 4 == 0
]


def _step(net, run, inputs) -> tuple[dict, dict]:
    """One forward and backward of a weighted sum of the float outputs: (outputs, grads of
    the params and the inputs)."""
    net.zero_grad()
    x = {k: v.double().requires_grad_() if v.is_floating_point() else v for k, v in inputs.items()}
    outputs = run(**x)
    terms = [
        (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape)).sum()
        for o in outputs.values()
        if o.requires_grad
    ]
    if terms:
        sum(terms).backward()
    grads = {n: p.grad for n, p in net.named_parameters() if p.grad is not None}
    grads.update({k: v.grad for k, v in x.items() if v.requires_grad and v.grad is not None})
    return {k: v.detach() for k, v in outputs.items()}, grads


@pytest.mark.parametrize("case", TRAINED)
def test_golden_net_trains_compiled(case):
    """In the case's own phase, float64: a compiled forward + backward gives the eager one's
    outputs and gradients, and no autograd.Function that dynamo traced returns a tensor it
    wrote in place (``functions_returning_writes``: torch 2.11 lost their gradient)."""
    with InFolder(case.path):
        net = case_net(case, case.meta["phase"].lower()).double()
        twin = copy.deepcopy(net)
        inputs = case_inputs(case)
        torch._dynamo.reset()
        graphs: list[torch.fx.GraphModule] = []
        aot_eager = torch._dynamo.lookup_backend("aot_eager")

        def backend(gm, example_inputs):
            graphs.append(gm)
            return aot_eager(gm, example_inputs)

        got = _step(net, torch.compile(net, backend=backend), inputs)
        want = _step(twin, twin, inputs)
    assert not functions_returning_writes(graphs)
    for part in (0, 1):
        assert got[part].keys() == want[part].keys()
        for name, value in want[part].items():
            torch.testing.assert_close(got[part][name], value, rtol=1e-6, atol=1e-8, equal_nan=True)
