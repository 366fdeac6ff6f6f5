"""LayerCase: one row of a layer's case table, in the way of PyTorch's ModuleInfo.

Every per-layer test module defines ``CASES: list[LayerCase]``; ``tests/test_registry.py``
runs generic checks (repr, state_dict round trip, .double(), CPU/CUDA parity) over all of
them and fails when a registered type has no case.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from torchcaffe.trust import allow_python_layers

from .harness import make_layer


@dataclass(frozen=True)
class LayerCase:
    type: str
    snippet: str = ""
    bottom_shapes: Sequence[Sequence[int]] = ((2, 3, 4, 5),)
    n_tops: int = 1
    phase: str = "TRAIN"
    # Optional factory (torch.Generator) -> bottoms, for inputs that must be valid
    # (labels, indices, positive values, ...).
    make_bottoms: Callable[[torch.Generator], list[torch.Tensor]] | None = None
    deterministic: bool = True  # False: forward draws random numbers (Dropout TRAIN, ...)
    id: str = field(default="")
    trusted: bool = False  # Python layers: build with the allow_python_layers opt-in

    def build(self, seed: int = 1701):
        bottoms = None
        if self.make_bottoms is not None:
            bottoms = self.make_bottoms(torch.Generator().manual_seed(seed))
        with allow_python_layers(self.trusted):
            return make_layer(
                self.snippet,
                self.bottom_shapes,
                type=self.type,
                n_tops=self.n_tops,
                phase=self.phase,
                seed=seed,
                bottoms=bottoms,
            )

    @property
    def name(self) -> str:
        return self.id or f"{self.type}:{self.snippet[:40]}"
