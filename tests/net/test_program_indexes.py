"""The passes' one-scan indexes over a program (who wrote each bottom, who reads each top)
agree with the step-by-step searches they replaced (those made a blob with thousands of
readers quadratic): on real nets with Splits, in-place chains and Concats."""

from __future__ import annotations

import pytest

import torchcaffe
from torchcaffe.net.passes.program import bottom_producers, readers_of
from torchcaffe.net.passes.splits import _readers_of_tops


def _producer(steps, index, blob):
    for j in range(index - 1, -1, -1):
        if blob in steps[j].tops:
            return j
    return None


@pytest.mark.parametrize(
    "model", ["bvlc_googlenet/deploy.prototxt", "resnet50_kaiminghe/ResNet-50-deploy.prototxt"]
)
def test_one_scan_indexes_match_the_searches(models_root, model):
    steps = tuple(torchcaffe.load(models_root / model).steps)
    producers = bottom_producers(steps)
    assert [list(p) for p in producers] == [
        [_producer(steps, i, b) for b in step.bottoms] for i, step in enumerate(steps)
    ]
    splits = [i for i, step in enumerate(steps) if step.type == "Split"]
    assert splits
    for i in splits:
        want = {top: readers_of(steps, i, top) for top in steps[i].tops}
        assert _readers_of_tops(list(steps), i) == want


def test_a_blob_read_by_thousands_of_layers_builds_and_runs(tmp_path):
    """A Split of 3000 tops (each read once, one rewritten in place): the split bypass and
    the ReLU passes index it in one scan; the outputs are the ReLUs' values."""
    import torch

    layers = "".join(
        f'layer {{ name: "r{i}" type: "ReLU" bottom: "data" top: "o{i}" }}\n' for i in range(3000)
    )
    path = tmp_path / "fan.prototxt"
    path.write_text(
        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 } } }\n'
        + layers
    )
    out = torchcaffe.load(path)(data=torch.tensor([-1.0, 2.0]))
    assert len(out) == 3000 and all(v.tolist() == [0.0, 2.0] for v in out.values())
