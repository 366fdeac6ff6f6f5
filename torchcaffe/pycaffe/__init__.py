"""pycaffe-compatible face: the Caffe-style Net over a compiled torch module."""

from torchcaffe.pycaffe.net import Net
from torchcaffe.pycaffe.solver import (
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    NesterovSolver,
    RMSPropSolver,
    SGDSolver,
    get_solver,
)

__all__ = [
    "Net",
    "SGDSolver",
    "NesterovSolver",
    "AdaGradSolver",
    "RMSPropSolver",
    "AdaDeltaSolver",
    "AdamSolver",
    "get_solver",
]
