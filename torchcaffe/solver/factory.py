"""A solver definition as a torch optimizer and LR scheduler, for the torch face.

net = torchcaffe.load("train_val.prototxt", phase="train", input_shapes=...)
param, _ = load_solver_param("solver.prototxt")
opt = make_optimizer(param, net)          # Caffe's update rule, lr_mult/decay_mult groups
sched = make_lr_policy(param, opt)        # Caffe's lr_policy
for it in range(param.max_iter):
    opt.zero_grad(); net.total_loss(net.forward_all_blobs(...)).backward()
    opt.step(); sched.step()
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import SolverError
from ..proto import caffe_pb2
from .config import PathLike, load_solver_param
from .lr_policy import LR_POLICIES, CaffeLRPolicy, policy_arguments
from .optimizers import OPTIMIZERS, REGULARIZATION_TYPES, CaffeOptimizer
from .param_groups import Learnable, learnable_params, multiplier_groups

if TYPE_CHECKING:
    from ..net.net import TorchNet

# SolverParameter fields each update rule reads (beyond lr, decay and clipping).
RULE_FIELDS = {
    "SGD": ("momentum",),
    "Nesterov": ("momentum",),
    "AdaGrad": ("delta",),
    "RMSProp": ("rms_decay", "delta"),
    "AdaDelta": ("momentum", "delta"),
    "Adam": ("momentum", "momentum2", "delta"),
}


def make_optimizer(
    param: caffe_pb2.SolverParameter | PathLike,
    net: TorchNet | list[Learnable],
    solver_type: str | None = None,
) -> CaffeOptimizer:
    """The update rule of ``solver_type`` (default: ``param.type``) over ``net``'s params.

    ``param``: a SolverParameter, or the path of a solver.prototxt (read and upgraded as
    Caffe's tool reads it). Every learnable param is stepped each ``step``, a zero gradient
    standing in where backward left none (after ``zero_grad``), as Caffe's ApplyUpdate does
    with the cleared diffs. Blobs that are buffers here (BatchNorm statistics) get their
    Caffe history tracked (``CaffeOptimizer.track_statistics``) without being moved."""
    param = _solver_param(param)
    solver_type = solver_type or param.type
    if solver_type not in OPTIMIZERS:  # Caffe's SolverRegistry: "Unknown solver type"
        raise SolverError(
            f"unknown solver type {solver_type!r}", expected=f"one of {sorted(OPTIMIZERS)}"
        )
    cls = OPTIMIZERS[solver_type]
    rule = {name: getattr(param, name) for name in RULE_FIELDS[solver_type]}
    groups = multiplier_groups(net) or [{"params": [], "lr_mult": 1.0, "decay_mult": 1.0}]
    regularization = param.regularization_type
    if regularization not in REGULARIZATION_TYPES:  # unused without weight decay, as in Caffe
        regularization = "L2"
    optimizer = cls(
        groups,
        max(param.base_lr, 0.0),
        weight_decay=param.weight_decay,
        regularization_type=regularization,
        clip_gradients=param.clip_gradients,
        iter_size=param.iter_size,
        zero_absent_grads=True,
        **rule,
    )
    # Caffe takes a negative base_lr (the update climbs the loss); the optimizer's own check
    # (torch's convention for a hand-built optimizer) refuses one at construction only
    for group in optimizer.param_groups:
        group["lr"] = param.base_lr
    entries = net if isinstance(net, list) else learnable_params(net)
    optimizer.track_statistics((e.tensor, e.decay_mult) for e in entries if not e.optimized)
    return optimizer


def make_lr_policy(
    param: caffe_pb2.SolverParameter | PathLike, optimizer: CaffeOptimizer
) -> CaffeLRPolicy:
    """The scheduler of ``param.lr_policy`` (a SolverParameter or a solver.prototxt path), at
    iteration 0."""
    param = _solver_param(param)
    # Caffe's GetLearningRate: "Unknown learning rate policy"
    if param.lr_policy not in LR_POLICIES:
        raise SolverError(
            f"unknown lr_policy {param.lr_policy!r}", expected=f"one of {sorted(LR_POLICIES)}"
        )
    cls = LR_POLICIES[param.lr_policy]
    return cls(optimizer, **policy_arguments(param.lr_policy, param))


def _solver_param(param: caffe_pb2.SolverParameter | PathLike) -> caffe_pb2.SolverParameter:
    """``param`` itself, or the SolverParameter its path names; anything else is refused
    (it would fail later on a missing attribute)."""
    if isinstance(param, caffe_pb2.SolverParameter):
        return param
    if isinstance(param, (str, os.PathLike)):
        return load_solver_param(param)[0]
    raise SolverError(
        f"a {type(param).__name__} is no solver definition",
        expected="a SolverParameter or the path of a solver.prototxt",
        hint="load_solver_param(path) returns (param, path): pass its first item",
    )
