"""``ops._exporting.exporting``: torch.export, not torch.compile, is tracing. Torch 2.11's
dynamo answered ``torch.compiler.is_exporting()`` with True in every trace, so each compiled
graph took its export form there (no opaque oneDNN ops, LRN's autograd backward instead of
Caffe's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import torchcaffe
from torchcaffe.ops._exporting import exporting

from ..helpers.exports import leaking_failed_export


class _Flag(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (1.0 if exporting() else 0.0)


def test_exporting_is_false_eagerly_and_under_compile():
    x = torch.zeros(1)
    assert _Flag()(x).item() == 0.0
    torch._dynamo.reset()
    assert torch.compile(_Flag(), backend="eager", fullgraph=True)(x).item() == 0.0


@pytest.mark.parametrize("strict", [False, True])
def test_exporting_is_true_under_export(strict):
    x = torch.zeros(1)
    program = torch.export.export(_Flag(), (x,), strict=strict)
    assert program.module()(x).item() == 1.0


def test_the_package_asks_exporting_not_torch():
    root = Path(torchcaffe.__file__).parent
    direct = [
        f"{path.relative_to(root)}:{number}"
        for path in root.rglob("*.py")
        if path.name != "_exporting.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bis_exporting\(\)", line)
    ]
    assert not direct, direct


def test_a_failed_export_leaves_no_buffer_registration_hook(monkeypatch):
    """Torch 2.11 and 2.12 left their non-strict trace's buffer-assignment hook registered
    after a failed export; a later compile of a recurrent net (which sets its carried state
    in forward) then broke its graph. ``export_net`` removes what the export left."""
    from google.protobuf import text_format

    from torchcaffe.errors import ExportError
    from torchcaffe.net.export import export_net
    from torchcaffe.proto import caffe_pb2

    text = (
        'input: "data" input_shape { dim: 2 dim: 3 }\n'
        'layer { name: "r" type: "ReLU" bottom: "data" top: "y" }'
    )
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="test")
    with leaking_failed_export(monkeypatch, torch.export):
        with pytest.raises(ExportError, match="data-dependent"):
            export_net(net, {"data": torch.zeros(2, 3)})
