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

from typing import TYPE_CHECKING

from ..proto import caffe_pb2
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
    param: caffe_pb2.SolverParameter,
    net: TorchNet | list[Learnable],
    solver_type: str | None = None,
) -> CaffeOptimizer:
    """The update rule of ``solver_type`` (default: ``param.type``) over ``net``'s params.

    Every learnable param is stepped each ``step``, a zero gradient standing in where backward
    left none (after ``zero_grad``), as Caffe's ApplyUpdate does with the cleared diffs.
    Blobs that are buffers here (BatchNorm statistics) get their Caffe history tracked
    (``CaffeOptimizer.track_statistics``) without being moved."""
    solver_type = solver_type or param.type
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


def make_lr_policy(param: caffe_pb2.SolverParameter, optimizer: CaffeOptimizer) -> CaffeLRPolicy:
    """The scheduler of ``param.lr_policy``, at iteration 0."""
    cls = LR_POLICIES[param.lr_policy]
    return cls(optimizer, **policy_arguments(param.lr_policy, param))
