"""Every golden net fed by Input blobs through ``export_onnx`` (dynamic batch), run in
onnxruntime against the eager net at the example's batch and at twice it.

Each net of ``tests/golden`` (layers/, forks/, nets/) whose ``in/`` arrays are its inputs is
loaded in TEST phase and exported by both exporters. The graph's outputs must equal the
net's, or, for the nets listed in ``REFUSED``, the export must raise ``ExportError``. Every
case goes through the TorchScript exporter; the dynamo exporter (about 0.6 s a net) takes
every fifth case by default and all of them with ``TORCHCAFFE_SLOW=1``. A case that starts
to export must leave its list; one that starts to be refused must join it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from torchcaffe.converters.onnx import export_onnx
from torchcaffe.errors import ExportError
from torchcaffe.net.export import batch_groups

from ..helpers.golden import (
    RECURRENT_NETS,
    InFolder,
    case_inputs,
    case_net,
    input_fed_cases,
    twice_the_batch,
)

ort = pytest.importorskip("onnxruntime")
GOLDEN = Path(__file__).resolve().parents[1] / "golden"

RECURRENT = [*RECURRENT_NETS, "layers/lstm_unit"]
# the batch cannot change there (see tests/net/test_golden_graphs.py): refused with a symbolic
# batch, exported with a fixed one
FIXED_BATCH = {*RECURRENT, "layers/scale_2bottoms_axis0_bias", "layers/slice_axis0_equal"}
# refused by both: FIXED_BATCH with a symbolic batch, and where a top's size depends on the
# values
BOTH = {
    *FIXED_BATCH,
    "forks/detection_evaluate",
    "forks/detection_output_corner_nonshared",
    "forks/detection_output_ssd",
    "forks/proposal_rpn",
}
REFUSED = {
    # torch's exporters have no ONNX form for a top-k ArgMax's sort with an out parameter
    # (TorchScript) or for its sort (dynamo); the TorchScript exporter cannot trace SPP's
    # per-level pooling sizes; a Silence-only net has no output
    "torchscript": BOTH
    | {
        "layers/argmax_axis1_topk",
        "layers/argmax_topk_outmax",
        "layers/spp_ave_h3",
        "layers/spp_max_h2",
        "layers/silence",
    },
    "dynamo": BOTH | {"layers/argmax_axis1_topk", "layers/argmax_topk_outmax", "layers/silence"},
}


CASES = input_fed_cases(GOLDEN)


EVERY_CASE_BY_DYNAMO = os.environ.get("TORCHCAFFE_SLOW") == "1"


def _params():
    for i, case in enumerate(CASES):
        yield pytest.param("torchscript", case, id=f"torchscript-{case.id}")
        if EVERY_CASE_BY_DYNAMO or i % 5 == 0:
            yield pytest.param("dynamo", case, id=f"dynamo-{case.id}")


def test_the_cases_cover_the_catalogue():
    assert len(CASES) >= 150
    ids = {c.id for c in CASES}
    assert ids >= REFUSED["torchscript"] and ids >= REFUSED["dynamo"]


@pytest.mark.parametrize("exporter, case", list(_params()))
def test_golden_net_exports_to_onnx(tmp_path, exporter, case):
    dynamo = exporter == "dynamo"
    if dynamo:
        pytest.importorskip("onnxscript")
    inputs = case_inputs(case)
    path = tmp_path / "net.onnx"
    with InFolder(case.path):
        net = case_net(case)
        shapes = {k: tuple(v.shape) for k, v in inputs.items()}
        if case.id in REFUSED[exporter]:
            with pytest.raises(ExportError):
                export_onnx(net, path, dynamo=dynamo, input_shapes=shapes)
            if case.id not in FIXED_BATCH:
                return
            export_onnx(net, path, dynamo=dynamo, dynamic_batch=False, input_shapes=shapes)
            _check_in_onnxruntime(net, path, [inputs])
            return
        export_onnx(net, path, dynamo=dynamo, input_shapes=shapes)
        traced = shapes
        if all(s and s[0] == 1 for s in shapes.values()):
            traced = {k: (2, *s[1:]) for k, s in shapes.items()}  # as export_onnx traces
        symbolic = batch_groups(net, traced)
        _check_in_onnxruntime(net, path, [inputs, twice_the_batch(inputs, symbolic)])


def _check_in_onnxruntime(net, path, feeds) -> None:
    """The exported graph's outputs against the net's, for each feed."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in sess.get_outputs()]
    for i, x in enumerate(feeds):
        with torch.no_grad():
            want = net(**x)
        got = sess.run(outputs, {k: v.numpy() for k, v in x.items()})
        for name, value in zip(outputs, got):
            np.testing.assert_allclose(
                value, want[name].numpy(), rtol=1e-4, atol=1e-5, err_msg=f"{name}, feed {i}"
            )
