"""pycaffe-compatible face: the Caffe-style Net over a compiled torch module (and what
pycaffe's ``caffe.pycaffe`` module imports from ``_caffe``: the solvers, NCCL, Timer)."""

from torchcaffe.pycaffe.net import Net
from torchcaffe.pycaffe.process import NCCL, Timer
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
    "NCCL",
    "Timer",
]
