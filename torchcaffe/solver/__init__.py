"""Caffe-exact training: update rules, lr policies, the solver loop and .solverstate files.

Torch face: ``make_optimizer`` / ``make_lr_policy`` turn a solver definition into a torch
optimizer and scheduler over a compiled net. Caffe face: ``Solver`` (and pycaffe's
``SGDSolver``, ``AdamSolver``, ... in ``torchcaffe.pycaffe.solver``) runs Caffe's loop.
"""

from .config import check_solver_param, load_solver_param
from .factory import make_lr_policy, make_optimizer
from .lr_policy import (
    LR_POLICIES,
    CaffeLRPolicy,
    ExpPolicy,
    FixedPolicy,
    InvPolicy,
    MultiStepPolicy,
    PolyPolicy,
    SigmoidPolicy,
    StepPolicy,
)
from .optimizers import (
    OPTIMIZERS,
    CaffeAdaDelta,
    CaffeAdaGrad,
    CaffeAdam,
    CaffeNesterov,
    CaffeOptimizer,
    CaffeRMSProp,
    CaffeSGD,
)
from .param_groups import Learnable, learnable_params, multiplier_groups, param_groups
from .solver import Callback, Solver
from .state import SolverSnapshot, read_solverstate, write_solverstate, write_solverstate_hdf5

__all__ = [
    "LR_POLICIES",
    "OPTIMIZERS",
    "CaffeAdaDelta",
    "CaffeAdaGrad",
    "CaffeAdam",
    "CaffeLRPolicy",
    "CaffeNesterov",
    "CaffeOptimizer",
    "CaffeRMSProp",
    "CaffeSGD",
    "Callback",
    "ExpPolicy",
    "FixedPolicy",
    "InvPolicy",
    "Learnable",
    "MultiStepPolicy",
    "PolyPolicy",
    "SigmoidPolicy",
    "Solver",
    "SolverSnapshot",
    "StepPolicy",
    "check_solver_param",
    "learnable_params",
    "load_solver_param",
    "make_lr_policy",
    "make_optimizer",
    "multiplier_groups",
    "param_groups",
    "read_solverstate",
    "write_solverstate",
    "write_solverstate_hdf5",
]
