"""An input with one axis more or one fewer than its net was set up for is a located error
(or runs, where Caffe's layers take any axis count), never a bare torch error from inside a
layer: the torch face checks each new input shape once (``infer_shapes``), and every layer's
``output_shapes`` checks what its set-up checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchcaffe.errors import TorchCaffeError

from ..helpers.golden import InFolder, case_inputs, case_net, input_fed_cases

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CASES = [pytest.param(c, id=c.id) for c in input_fed_cases(GOLDEN)]


def _reshaped(x: torch.Tensor, change: str) -> torch.Tensor:
    if change == "one axis more":
        return x.unsqueeze(-1)
    return x.flatten(-2) if x.dim() >= 2 else x[0]  # one axis fewer


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("change", ["one axis more", "one axis fewer"])
def test_an_input_of_another_axis_count_runs_or_names_the_layer(case, change):
    with InFolder(case.path):
        net = case_net(case)
        inputs = case_inputs(case)
        first = sorted(inputs)[0]
        inputs[first] = _reshaped(inputs[first], change)
        try:
            with torch.inference_mode():
                net(**inputs)
        except TorchCaffeError:
            pass
