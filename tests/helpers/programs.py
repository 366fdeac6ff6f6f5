"""The layer-by-layer program's blobs, the reference the passes are compared with; and a GPU's
programs run on the CPU, so that the passes' forms for another device are checked against
Caffe's values on a machine that has none."""

from __future__ import annotations

from typing import Any

import torch

import torchcaffe
from torchcaffe.net import net as net_module
from torchcaffe.net import passes


def literal_blobs(net: torchcaffe.TorchNet, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every blob of ``net`` fed ``data=x``, with the passes off (copies: in-place layers
    would otherwise leave later values in them)."""
    net.optimize = False
    try:
        with torch.no_grad():
            return {k: v.clone() for k, v in net.forward_all_blobs(data=x).items()}
    finally:
        net.optimize = True


# layers whose top is their bottom's memory in Caffe (Blob::ShareData), with one bottom:
# every Split top; the one top of these
_SHARING = ("Flatten", "Reshape", "Concat", "Slice")


def literal_blobs_in_caffe_memory(
    net: torchcaffe.TorchNet, x: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Every blob of ``net`` fed ``data=x``, layer by layer as ``literal_blobs``, but with
    the memories Caffe's blobs share: a Split top and the top of a one-bottom Flatten,
    Reshape, Concat or one-top Slice are views of their bottom's memory, so a layer in place
    on one of them writes them all, and a later reader of any of them sees that write (the
    Caffe face's semantics; the torch face does not model it). Derived here from the layer
    types alone, independently of the net's own account of its shares."""
    owner: dict[str, str] = {}
    for step in net.steps:
        one = len(step.bottoms) == 1
        if (step.type == "Split" and one) or (
            step.type in _SHARING and one and len(step.tops) == 1
        ):
            for top in step.tops:
                if top != step.bottoms[0]:
                    owner[top] = owner.get(step.bottoms[0], step.bottoms[0])
    memory: dict[str, torch.Tensor] = {}  # owner -> its values, flat
    shapes: dict[str, torch.Size] = {}

    def write(name: str, value: torch.Tensor) -> None:
        shapes[name] = value.shape
        memory[owner.get(name, name)] = value.detach().clone().reshape(-1)

    def read(name: str) -> torch.Tensor:
        return memory[owner.get(name, name)].reshape(shapes[name])

    net.optimize = False
    try:
        with torch.no_grad():
            for name, value in net.bind_inputs((), {"data": x}).items():
                write(name, value)
            for i, step in enumerate(net.steps):
                if step.type == "Input":
                    continue  # bound above
                blobs = {b: read(b) for b in step.bottoms if b in shapes}
                net.run(blobs, i, i)
                for top in step.tops:
                    write(top, blobs[top])
    finally:
        net.optimize = True
    return {name: read(name).clone() for name in shapes}


def off_cpu_programs(monkeypatch: Any, *nets: torchcaffe.TorchNet) -> None:
    """From here on the nets' programs are those for a run off the CPU (``on_cpu=False``),
    whatever the device; the programs ``nets`` had made are dropped."""

    def inference(steps, modules, observable, on_cpu=True):
        return passes.optimize_for_inference(steps, modules, observable, on_cpu=False)

    def training(steps, modules, observable, on_cpu=True):
        return passes.optimize_for_training(steps, modules, observable, on_cpu=False)

    monkeypatch.setattr(net_module, "optimize_for_inference", inference)
    monkeypatch.setattr(net_module, "optimize_for_training", training)
    for net in nets:
        net._programs.clear()
