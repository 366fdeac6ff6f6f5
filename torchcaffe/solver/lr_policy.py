"""Caffe's ``lr_policy`` values as torch LR schedulers: the rate is a function of the iteration.

``last_epoch`` is Caffe's ``iter_`` (the number of updates done), so the usual torch loop —
``optimizer.step(); scheduler.step()`` — gives update ``k`` the rate Caffe's GetLearningRate
returns at ``iter_ == k``. Formulas (base = base_lr, it = iteration):

    fixed      base
    step       base * gamma ^ floor(it / stepsize)
    exp        base * gamma ^ it
    inv        base * (1 + gamma * it) ^ (-power)
    multistep  base * gamma ^ current_step   (current_step += 1 when it >= stepvalue[step])
    poly       base * (1 - it / max_iter) ^ power
    sigmoid    base / (1 + exp(-gamma * (it - stepsize)))

Each scheduler sets ``group["lr"]`` to that rate (rounded to float32, Caffe's Dtype); the
optimizer multiplies by the group's ``lr_mult``. ``current_step`` is Caffe's
``current_step_``: ``snapshot_step`` is the value a .solverstate written now holds, and
``restore`` resumes from one.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

log = logging.getLogger("torchcaffe.solver")


def _f32(x: float) -> float:
    return float(np.float32(x))


def _pow(base: float, exponent: float) -> float:
    """C's pow: NaN for a negative base and a non-integer exponent (poly past max_iter), inf
    on overflow, where Python's ``**`` gives a complex number or raises."""
    with np.errstate(all="ignore"):
        return float(np.power(np.float64(base), np.float64(exponent)))


def _exp(x: float) -> float:
    """C's exp: inf on overflow (sigmoid far before its stepsize), where math.exp raises."""
    with np.errstate(all="ignore"):
        return float(np.exp(np.float64(x)))


class CaffeLRPolicy(LRScheduler, metaclass=abc.ABCMeta):
    """Base: subclasses give ``factor(iteration)`` (the rate over base_lr) and may move
    ``current_step`` in ``advance``."""

    policy: ClassVar[str] = ""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        self.current_step = 0
        self.snapshot_step = 0
        super().__init__(optimizer, last_epoch)

    def advance(self, iteration: int) -> None:
        """Caffe's side effects on ``current_step_`` at GetLearningRate (none by default)."""

    @abc.abstractmethod
    def factor(self, iteration: int) -> float:
        """The rate over base_lr at ``iteration`` (Caffe's GetLearningRate)."""

    def rate(self, base_lr: float, iteration: int) -> float:
        """Caffe's rate for ``base_lr`` at ``iteration``, given the current ``current_step``."""
        return _f32(_f32(base_lr) * self.factor(iteration))

    def get_lr(self) -> list[float | Tensor]:
        self.snapshot_step = self.current_step
        self.advance(self.last_epoch)
        return [self.rate(float(base), self.last_epoch) for base in self.base_lrs]

    def restore(self, iteration: int, current_step: int) -> None:
        """Resume at Caffe's ``iter_`` / ``current_step_`` from a .solverstate."""
        self.last_epoch = int(iteration)
        self.current_step = int(current_step)
        values = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = list(values)

    @property
    def lr(self) -> float:
        """The rate of the current iteration (pycaffe's ``solver.lr``)."""
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer.param_groups else 0.0


class FixedPolicy(CaffeLRPolicy):
    policy = "fixed"

    def factor(self, iteration):
        return 1.0


class StepPolicy(CaffeLRPolicy):
    policy = "step"

    def __init__(self, optimizer, gamma: float, stepsize: int, last_epoch: int = -1) -> None:
        self.gamma, self.stepsize = _f32(gamma), int(stepsize)
        super().__init__(optimizer, last_epoch)

    def advance(self, iteration):
        self.current_step = iteration // self.stepsize

    def factor(self, iteration):
        return _pow(self.gamma, self.current_step)


class ExpPolicy(CaffeLRPolicy):
    policy = "exp"

    def __init__(self, optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = _f32(gamma)
        super().__init__(optimizer, last_epoch)

    def factor(self, iteration):
        return _pow(self.gamma, iteration)


class InvPolicy(CaffeLRPolicy):
    policy = "inv"

    def __init__(self, optimizer, gamma: float, power: float, last_epoch: int = -1) -> None:
        self.gamma, self.power = _f32(gamma), _f32(power)
        super().__init__(optimizer, last_epoch)

    def factor(self, iteration):
        return _pow(_f32(1.0 + _f32(self.gamma * iteration)), -self.power)


class MultiStepPolicy(CaffeLRPolicy):
    """Steps at each ``stepvalue``; like Caffe, at most one step per call, in order."""

    policy = "multistep"

    def __init__(
        self, optimizer, gamma: float, stepvalue: Sequence[int], last_epoch: int = -1
    ) -> None:
        self.gamma, self.stepvalue = _f32(gamma), [int(v) for v in stepvalue]
        super().__init__(optimizer, last_epoch)

    def advance(self, iteration):
        if (
            self.current_step < len(self.stepvalue)
            and iteration >= self.stepvalue[self.current_step]
        ):
            self.current_step += 1
            log.info("MultiStep Status: Iteration %d, step = %d", iteration, self.current_step)

    def factor(self, iteration):
        return _pow(self.gamma, self.current_step)


class PolyPolicy(CaffeLRPolicy):
    policy = "poly"

    def __init__(self, optimizer, power: float, max_iter: int, last_epoch: int = -1) -> None:
        self.power, self.max_iter = _f32(power), int(max_iter)
        super().__init__(optimizer, last_epoch)

    def factor(self, iteration):
        return _pow(_f32(1.0 - _f32(iteration / self.max_iter)), self.power)


class SigmoidPolicy(CaffeLRPolicy):
    policy = "sigmoid"

    def __init__(self, optimizer, gamma: float, stepsize: int, last_epoch: int = -1) -> None:
        self.gamma, self.stepsize = _f32(gamma), int(stepsize)
        super().__init__(optimizer, last_epoch)

    def factor(self, iteration):
        # Caffe's exponent is a Dtype product: -gamma * (Dtype(iter_) - Dtype(stepsize)),
        # rounded to float32 before exp (in double, a quarter of a warm-up's rates differ)
        distance = _f32(_f32(iteration) - _f32(self.stepsize))
        return 1.0 / (1.0 + _exp(_f32(-self.gamma * distance)))


LR_POLICIES: dict[str, type[CaffeLRPolicy]] = {
    cls.policy: cls
    for cls in (
        FixedPolicy,
        StepPolicy,
        ExpPolicy,
        InvPolicy,
        MultiStepPolicy,
        PolyPolicy,
        SigmoidPolicy,
    )
}


def policy_arguments(policy: str, param: Any) -> dict[str, Any]:
    """The SolverParameter fields a policy reads, as keyword arguments."""
    fields = {
        "fixed": (),
        "step": ("gamma", "stepsize"),
        "exp": ("gamma",),
        "inv": ("gamma", "power"),
        "multistep": ("gamma", "stepvalue"),
        "poly": ("power", "max_iter"),
        "sigmoid": ("gamma", "stepsize"),
    }[policy]
    return {name: getattr(param, name) for name in fields}
