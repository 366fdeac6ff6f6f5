"""Reading and checking a solver definition, before any net is built.

Caffe checks most solver fields with CHECKs scattered over Init, the solver constructors and
GetLearningRate (so a bad ``stepsize`` aborts only at the first update). Here they are all
checked up front, and each error names the solver file and the offending field.
"""

from __future__ import annotations

import os

from ..errors import SolverError, UnsupportedError
from ..formats.prototxt import read_solver
from ..formats.upgrade import upgrade_solver_as_needed
from ..proto import caffe_pb2
from .lr_policy import LR_POLICIES
from .optimizers import OPTIMIZERS, REGULARIZATION_TYPES

PathLike = str | os.PathLike
TRAIN_NET_FIELDS = ("net", "net_param", "train_net", "train_net_param")


def load_solver_param(
    source: PathLike | caffe_pb2.SolverParameter,
) -> tuple[caffe_pb2.SolverParameter, str | None]:
    """(upgraded SolverParameter, its path or None). A file goes through Caffe's
    ReadSolverParamsFromTextFileOrDie (solver_type enum, default snapshot_prefix)."""
    if isinstance(source, caffe_pb2.SolverParameter):
        return upgrade_solver_as_needed(source), None
    path = os.fspath(source)
    return read_solver(path), path


def field_error(path: str | None, field: str, what: str, **kw) -> SolverError:
    return SolverError(f"field '{field}': {what}", path=path, **kw)


def check_solver_param(
    param: caffe_pb2.SolverParameter, path: str | None, solver_type: str
) -> None:
    """Every check Caffe makes on a solver definition, raising SolverError."""
    if solver_type not in OPTIMIZERS:
        raise field_error(
            path,
            "type",
            "unknown solver type",
            expected=" | ".join(OPTIMIZERS),
            got=repr(solver_type),
        )
    _check_nets(param, path)
    _check_policy(param, path)
    if param.average_loss < 1:
        raise field_error(
            path, "average_loss", "must be at least 1", expected=">= 1", got=param.average_loss
        )
    if param.iter_size < 1:
        raise field_error(
            path, "iter_size", "must be at least 1", expected=">= 1", got=param.iter_size
        )
    if param.weight_decay and param.regularization_type not in REGULARIZATION_TYPES:
        raise field_error(
            path,
            "regularization_type",
            "unknown regularization type",
            expected=" | ".join(REGULARIZATION_TYPES),
            got=repr(param.regularization_type),
        )
    if solver_type in ("AdaGrad", "RMSProp") and param.momentum != 0:
        raise field_error(
            path,
            "momentum",
            f"momentum cannot be used with {solver_type}",
            expected=0,
            got=param.momentum,
            hint="delete the momentum line",
        )
    if solver_type == "RMSProp" and not 0 <= param.rms_decay < 1:
        raise field_error(
            path, "rms_decay", "must lie in [0, 1)", expected="0 <= x < 1", got=param.rms_decay
        )
    # Caffe checks presence only: an explicit empty prefix writes "_iter_N.caffemodel"
    if param.snapshot and not param.HasField("snapshot_prefix"):
        raise field_error(
            path,
            "snapshot_prefix",
            "snapshot is set but snapshot_prefix is not",
            expected="a snapshot_prefix",
            got="none",
        )


def _check_nets(param: caffe_pb2.SolverParameter, path: str | None) -> None:
    given = [f for f in TRAIN_NET_FIELDS if param.HasField(f)]
    if len(given) != 1:
        raise SolverError(
            "the solver must name exactly one train net",
            path=path,
            expected=f"one of {', '.join(TRAIN_NET_FIELDS)}",
            got=", ".join(given) or "none",
        )
    generic = param.HasField("net") or param.HasField("net_param")
    specific = len(param.test_net) + len(param.test_net_param)
    if (len(param.test_iter) < specific) if generic else (len(param.test_iter) != specific):
        raise field_error(
            path,
            "test_iter",
            "test_iter must be given for each test net",
            expected=f"{'>=' if generic else ''}{specific}",
            got=len(param.test_iter),
        )
    instances = max(len(param.test_iter), specific)
    if param.test_state and len(param.test_state) != instances:
        raise field_error(
            path,
            "test_state",
            "give test_state once per test net, or never",
            expected=instances,
            got=len(param.test_state),
        )
    if instances and param.test_interval <= 0:
        raise field_error(
            path,
            "test_interval",
            "test nets need a positive test_interval",
            expected="> 0",
            got=param.test_interval,
        )


def _check_policy(param: caffe_pb2.SolverParameter, path: str | None) -> None:
    policy = param.lr_policy
    if policy == "plateau":
        raise UnsupportedError(
            "field 'lr_policy': the SSD fork's 'plateau' policy is not supported",
            path=path,
            expected=" | ".join(LR_POLICIES),
            got="'plateau'",
        )
    if policy not in LR_POLICIES:
        raise field_error(
            path,
            "lr_policy",
            "unknown learning rate policy",
            expected=" | ".join(LR_POLICIES),
            got=repr(policy),
        )
    if policy in ("step", "exp", "inv", "multistep", "sigmoid") and param.gamma < 0:
        raise field_error(
            path,
            "gamma",
            f"lr_policy '{policy}' needs gamma >= 0",
            expected=">= 0",
            got=param.gamma,
        )
    if policy in ("step", "sigmoid") and param.stepsize <= 0:
        raise field_error(
            path,
            "stepsize",
            f"lr_policy '{policy}' needs a positive stepsize",
            expected="> 0",
            got=param.stepsize,
        )
    if policy == "poly" and param.max_iter <= 0:
        raise field_error(
            path,
            "max_iter",
            "lr_policy 'poly' divides by max_iter",
            expected="> 0",
            got=param.max_iter,
        )
