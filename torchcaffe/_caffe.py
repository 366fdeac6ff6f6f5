"""What ``import caffe._caffe`` (pycaffe's C++ extension) gives: the names it binds that
torchcaffe has, so scripts that import from it directly run unchanged.

Not imported by ``torchcaffe/__init__`` (it reads ``__version__`` from there); the ``caffe``
alias answers ``caffe._caffe`` with this module.
"""

from __future__ import annotations

from . import __version__
from .blob import Blob
from .pycaffe.layer import BlobVec, Layer
from .pycaffe.net import Net
from .pycaffe.process import NCCL, Timer, has_nccl, init_log, log
from .pycaffe.solver import (
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    NesterovSolver,
    RMSPropSolver,
    SGDSolver,
    get_solver,
)
from .registry import layer_type_list
from .runtime import (
    set_device,
    set_mode_cpu,
    set_mode_gpu,
    set_multiprocess,
    set_random_seed,
    set_solver_count,
    set_solver_rank,
    solver_count,
    solver_rank,
)
from .solver.solver import Solver

__all__ = [
    "__version__",
    "Blob",
    "BlobVec",
    "Layer",
    "Net",
    "Solver",
    "SGDSolver",
    "NesterovSolver",
    "AdaGradSolver",
    "RMSPropSolver",
    "AdaDeltaSolver",
    "AdamSolver",
    "get_solver",
    "layer_type_list",
    "NCCL",
    "Timer",
    "has_nccl",
    "init_log",
    "log",
    "set_device",
    "set_mode_cpu",
    "set_mode_gpu",
    "set_random_seed",
    "solver_count",
    "set_solver_count",
    "solver_rank",
    "set_solver_rank",
    "set_multiprocess",
]
