"""Base classes declare their subclass hooks as abstract methods, so a subclass that forgets
one fails at construction instead of mid-forward."""

from __future__ import annotations

import pytest

from torchcaffe.data.db import DBReader
from torchcaffe.ops._data_source import BatchLoader
from torchcaffe.ops.convolution import ConvolutionBase
from torchcaffe.ops.recurrent import RecurrentLayer
from torchcaffe.solver.lr_policy import CaffeLRPolicy
from torchcaffe.solver.optimizers import CaffeOptimizer


@pytest.mark.parametrize(
    "base, hooks",
    [
        (ConvolutionBase, {"compute"}),
        (RecurrentLayer, {"add_params", "unroll"}),
        (CaffeLRPolicy, {"factor"}),
        (CaffeOptimizer, {"_update"}),
        (BatchLoader, {"next_batch"}),
        (DBReader, {"items", "get", "__len__", "close"}),
    ],
)
def test_hooks_are_abstract(base, hooks):
    assert base.__abstractmethods__ == frozenset(hooks)
    incomplete = type("Incomplete", (base,), {})
    with pytest.raises(TypeError, match="abstract"):
        incomplete.__new__(incomplete)
