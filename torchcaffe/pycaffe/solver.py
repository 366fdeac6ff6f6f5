"""pycaffe's solver classes: ``caffe.SGDSolver(path)`` ... ``caffe.AdamSolver(path)`` and
``caffe.get_solver(path)``.

As in pycaffe, a named class uses its own update rule whatever the file's ``type`` says;
``get_solver`` picks the class from ``type`` (after the old ``solver_type`` enum upgrade).
"""

from __future__ import annotations

import os
from typing import Any

from ..formats.user_schema import use_schema
from ..proto import caffe_pb2
from ..solver.config import load_solver_param
from ..solver.solver import Solver


class SGDSolver(Solver):
    solver_type = "SGD"


class NesterovSolver(SGDSolver):
    solver_type = "Nesterov"


class AdaGradSolver(SGDSolver):
    solver_type = "AdaGrad"


class RMSPropSolver(SGDSolver):
    solver_type = "RMSProp"


class AdaDeltaSolver(SGDSolver):
    solver_type = "AdaDelta"


class AdamSolver(SGDSolver):
    solver_type = "Adam"


SOLVER_CLASSES: dict[str, type[Solver]] = {
    cls.solver_type: cls
    for cls in (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver, AdaDeltaSolver, AdamSolver)  # type: ignore[misc]
}


def get_solver(solver: str | os.PathLike | caffe_pb2.SolverParameter, **options: Any) -> Solver:
    """Caffe's SolverRegistry::CreateSolver: the class named by the file's ``type``."""
    with use_schema(options.get("caffe_proto")):
        param, _ = load_solver_param(solver)
    cls = SOLVER_CLASSES.get(param.type, Solver)  # Solver reports an unknown type
    return cls(solver, **options)
