"""What ``import caffe._caffe`` (pycaffe's C++ extension) gives: the names it binds that
torchcaffe has, so scripts that import from it directly run unchanged.

The names come from ``torchcaffe`` itself (which does not import this module: it reads them
from there); the ``caffe`` alias answers ``caffe._caffe`` with this module.
"""

from __future__ import annotations

from . import (
    NCCL,
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    Blob,
    Layer,
    NesterovSolver,
    Net,
    RMSPropSolver,
    SGDSolver,
    Timer,
    __version__,
    get_solver,
    has_nccl,
    init_log,
    layer_type_list,
    log,
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
from .pycaffe.layer import BlobVec  # not a top-level name of torchcaffe
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
