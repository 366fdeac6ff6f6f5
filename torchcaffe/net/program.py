"""The static program a Net runs: one LayerStep per layer, in Caffe's order.

Wiring is data: each step names its bottom and top blobs, loss weights and Caffe's backward
flags (need_backward, bottom_need_backward, param_need_backward) as Net::Init computes them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerStep:
    index: int
    name: str  # Caffe layer name
    type: str  # Caffe type string
    key: str  # submodule key (Caffe names may hold characters torch forbids)
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    loss_weights: tuple[float, ...]
    propagate_down: tuple[bool, ...]  # False where propagate_down: false stops the gradient
    # (force_backward lifts it where the layer allows, as Caffe does)
    need_backward: bool
    bottom_need_backward: tuple[bool, ...]
    param_need_backward: tuple[bool, ...]

    @property
    def is_input(self) -> bool:
        return self.type == "Input"

    @property
    def in_place(self) -> tuple[bool, ...]:
        """Per top: does it overwrite the bottom of the same index (Caffe's in-place)?"""
        return tuple(
            j < len(self.bottoms) and self.bottoms[j] == t for j, t in enumerate(self.tops)
        )


@dataclass(frozen=True)
class ParamInfo:
    """One learnable param of the net (the owner, for shared params), with its multipliers."""

    layer: str  # Caffe name of the layer that owns the blob
    index: int  # the blob's index among that layer's param blobs
    lr_mult: float
    decay_mult: float
    step: int  # the owner's index in the steps (Caffe allows two layers one name)
