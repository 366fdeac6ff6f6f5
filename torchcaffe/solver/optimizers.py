"""Caffe's update rules (SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam) as torch optimizers.

They differ from ``torch.optim`` where Caffe does, because a model trained in Caffe must
train the same way here:

- one ``step`` is Caffe's ApplyUpdate: clip every gradient by the global L2 norm, then per
  param divide by ``iter_size`` (accumulated passes), add the L2 or L1 weight decay term
  (``weight_decay * decay_mult``), compute the update with ``local_rate = lr * lr_mult``,
  and subtract it (Net::Update);
- momentum multiplies the previous *step* (``history = momentum*history + local_rate*grad``),
  so the learning rate is inside the history, not applied after it as in torch's SGD;
- the gradient tensor ends holding the update that was applied (Caffe reuses the diff);
- scalars are rounded to float32 before they meet float32 tensors, as Caffe's ``Dtype``.

With ``foreach`` (the default) a step runs each rule's tensor ops once per param group over
all its params (``torch._foreach_*``), instead of once per param: the same kernels, in the
same order per tensor, so the values are the per-param loop's, bit for bit; what goes is the
per-param Python dispatch. ``foreach=False`` keeps the per-param loop (the reference).

``group["lr"]`` is the solver-wide rate (what an lr policy computes); ``group["lr_mult"]`` and
``group["decay_mult"]`` are the ParamSpec multipliers. State per param holds Caffe's history
blobs under ``history_keys``; ``CaffeOptimizer.history_blobs`` lists them in Caffe's order
(all params' first history, then all params' second one), as a .solverstate stores them.
Params whose ``grad`` is None are skipped (torch's convention), unless ``zero_absent_grads``:
then they are updated as with a zero gradient, as Caffe's solver updates every learnable param
each iteration, a cleared diff where backward wrote none (``propagate_down: false`` above it,
a branch no loss reads, ``lr_mult: 0``) -- weight decay and momentum still move it.
``make_optimizer`` sets it, so a torch loop follows the solver's trajectory.
"""

from __future__ import annotations

import abc
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch.optim import Optimizer

from ..errors import SolverError

log = logging.getLogger("torchcaffe.solver")

REGULARIZATION_TYPES = ("L2", "L1")


def _scalar(value: float, dtype: torch.dtype) -> float:
    """``value`` as Caffe's Dtype holds it: rounded to float32 for float32 tensors."""
    return float(np.float32(value)) if dtype == torch.float32 else float(value)


def _one_minus(value: float, dtype: torch.dtype) -> float:
    """``1 - value`` as Caffe's ``Dtype(1) - x``: in float32 arithmetic for float32 tensors."""
    if dtype == torch.float32:
        return float(np.float32(1) - np.float32(value))
    return 1.0 - float(value)


class CaffeOptimizer(Optimizer, metaclass=abc.ABCMeta):
    """Base: Caffe's ApplyUpdate around a per-param ``_update`` rule.

    ``clip_gradients`` < 0 disables clipping; ``iter_size`` is the number of forward/backward
    passes whose gradients were summed before this step (the step divides by it).
    ``zero_absent_grads``: a param without a grad is stepped with a zero one (Caffe), not
    skipped (torch).
    """

    history_keys: ClassVar[tuple[str, ...]] = ("history",)
    caffe_type: ClassVar[str] = ""
    # Whether the history moves at local_rate 0 (the adaptive rules square the gradient into
    # it); SGD's history is momentum * history + rate * grad, which stays 0 there.
    history_moves_at_zero_rate: ClassVar[bool] = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        *,
        lr_mult: float = 1.0,
        weight_decay: float = 0.0,
        decay_mult: float = 1.0,
        regularization_type: str = "L2",
        clip_gradients: float = -1.0,
        iter_size: int = 1,
        foreach: bool = True,
        zero_absent_grads: bool = False,
        **rule: Any,
    ) -> None:
        if lr < 0:
            raise SolverError("invalid learning rate", expected=">= 0", got=lr)
        if regularization_type not in REGULARIZATION_TYPES:
            raise SolverError(
                "unknown regularization_type",
                expected=f"one of {REGULARIZATION_TYPES}",
                got=repr(regularization_type),
            )
        if iter_size < 1:
            raise SolverError("iter_size must be >= 1", expected=">= 1", got=iter_size)
        defaults = dict(
            lr=lr,
            lr_mult=lr_mult,
            weight_decay=weight_decay,
            decay_mult=decay_mult,
            regularization_type=regularization_type,
            **rule,
        )
        super().__init__(params, defaults)
        self.clip_gradients = float(clip_gradients)
        self.iter_size = int(iter_size)
        self.foreach = bool(foreach)
        self.zero_absent_grads = bool(zero_absent_grads)
        # id(tensor) -> (tensor, decay_mult, history state): see ``track_statistics``
        self._statistics: dict[int, tuple[torch.Tensor, float, dict]] = {}

    # -- Caffe's ApplyUpdate --------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.zero_absent_grads:
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
        live = [
            (g, p, p.grad) for g in self.param_groups for p in g["params"] if p.grad is not None
        ]
        self._clip([grad for _, _, grad in live])
        if self.foreach:
            for group, params, grads in _batches(live):
                self._step_many(group, params, grads)
        else:
            for group, p, grad in live:
                if self.iter_size != 1:
                    grad.mul_(_scalar(1.0 / self.iter_size, grad.dtype))
                self._regularize(group, p, grad)
                self._update(group, p, grad, self._state(p), self._local_rate(group, p.dtype))
                p.sub_(grad)
        self._step_statistics()
        return loss

    def _step_many(self, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor]):
        """The per-param loop's ops over ``params`` (one group, dtype and device) at once."""
        dtype = params[0].dtype
        if self.iter_size != 1:
            torch._foreach_mul_(grads, _scalar(1.0 / self.iter_size, grads[0].dtype))
        decay = self._decay(group, dtype)
        if decay:
            if group["regularization_type"] == "L2":
                torch._foreach_add_(grads, params, alpha=decay)
            else:
                torch._foreach_add_(grads, torch._foreach_sign(params), alpha=decay)
        states = [self._state(p) for p in params]
        self._update_many(group, params, grads, states, self._local_rate(group, dtype))
        torch._foreach_sub_(params, grads)

    @staticmethod
    def _local_rate(group: dict, dtype: torch.dtype) -> float:
        """Caffe's ``local_rate = rate * lr_mult``, in the param's Dtype."""
        return _scalar(_scalar(group["lr"], dtype) * _scalar(group["lr_mult"], dtype), dtype)

    @staticmethod
    def _decay(group: dict, dtype: torch.dtype) -> float:
        """Caffe's ``local_decay = weight_decay * decay_mult``, in the param's Dtype."""
        return _scalar(
            _scalar(group["weight_decay"], dtype) * _scalar(group["decay_mult"], dtype), dtype
        )

    def _clip(self, grads: Sequence[torch.Tensor]) -> None:
        """Scale every gradient by clip/norm when their global L2 norm exceeds ``clip``.

        As SGDSolver::ClipGradients, the norm and the factor are Dtype values: each blob's sum
        of squares is added into a Dtype total, whose Dtype square root divides ``clip`` in
        Dtype; the same steps in double give a factor one float32 ulp off in about a third
        of the updates."""
        if self.clip_gradients < 0 or not grads:
            return
        dtype = grads[0].dtype
        sumsq = 0.0
        for g in grads:
            sumsq = _scalar(sumsq + _scalar(float(g.double().square().sum()), dtype), dtype)
        norm = _scalar(math.sqrt(sumsq), dtype)
        clip = _scalar(self.clip_gradients, dtype)
        if norm > clip:
            factor = _scalar(clip / norm, dtype)
            log.info(  # SGDSolver::ClipGradients' line, which users watch in the log
                "Gradient clipping: scaling down gradients (L2 norm %g > %g) by scale factor %g",
                norm,
                self.clip_gradients,
                factor,
            )
            for g in grads:
                g.mul_(_scalar(factor, g.dtype))

    def _regularize(self, group: dict, p: torch.Tensor, grad: torch.Tensor) -> None:
        decay = self._decay(group, p.dtype)
        if not decay:
            return
        if group["regularization_type"] == "L2":
            grad.add_(p, alpha=decay)
        else:  # L1: the sign of the weight
            grad.add_(torch.sign(p), alpha=decay)

    def _state(self, p: torch.Tensor) -> dict:
        """This param's history tensors, created as zeros and kept on the param's device."""
        state = self.state[p]
        for key in self.history_keys:
            value = state.get(key)
            if value is None:
                state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif value.device != p.device or value.dtype != p.dtype:
                state[key] = value.to(device=p.device, dtype=p.dtype)
        return state

    @abc.abstractmethod
    def _update(
        self, group: dict, p: torch.Tensor, grad: torch.Tensor, state: dict, local_rate: float
    ) -> None:
        """Turn ``grad`` (in place) into the value Net::Update subtracts."""

    def _update_many(
        self,
        group: dict,
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        states: list[dict],
        local_rate: float,
    ) -> None:
        """``_update`` over a batch of params; a rule overrides it with ``_foreach`` ops."""
        for p, grad, state in zip(params, grads, states):
            self._update(group, p, grad, state, local_rate)

    # -- blobs Caffe's solver sees but never moves -----------------------------------------
    def track_statistics(self, blobs: Iterable[tuple[torch.Tensor, float]]) -> None:
        """Run the rule's history on ``(tensor, decay_mult)`` blobs that are not params here
        (torch buffers: a BatchNorm's statistics) but are learnable blobs with ``lr_mult: 0``
        in Caffe. Their diff is zero, so with weight decay Caffe's ApplyUpdate feeds
        ``decay * w`` into the rule: the update is 0 * ... (the blob stays), but the adaptive
        rules' histories (AdaGrad, RMSProp, AdaDelta, Adam) grow, and a .solverstate holds
        them. Kept outside ``param_groups`` and ``state``, so torch's view of the optimizer
        (and its state_dict) is unchanged."""
        for tensor, decay_mult in blobs:
            self._statistics[id(tensor)] = (tensor, float(decay_mult), {})

    def retarget_statistics(self, old: torch.Tensor, new: torch.Tensor) -> None:
        """A tracked blob's tensor was replaced (a device move, shared memory): follow it."""
        entry = self._statistics.pop(id(old), None)
        if entry is not None:
            self._statistics[id(new)] = (new, entry[1], entry[2])

    def _step_statistics(self) -> None:
        """Caffe's ApplyUpdate on the tracked blobs: zero diff, regularize, the rule at
        ``local_rate`` 0; the result (zero) is not applied. SGD and Nesterov keep a zero
        history then (``momentum * 0 + 0``), so only the adaptive rules do any work."""
        if not self._statistics or not self.history_moves_at_zero_rate:
            return
        base = dict(self.param_groups[0]) if self.param_groups else dict(self.defaults)
        for tensor, decay_mult, state in self._statistics.values():
            group = dict(base, lr_mult=0.0, decay_mult=decay_mult)
            if not state and not self._decay(group, tensor.dtype):
                continue  # zero diff into zero history: it stays zero, in every rule
            with torch.no_grad():
                grad = torch.zeros_like(tensor)
                self._regularize(group, tensor, grad)
                self._update(group, tensor, grad, self._statistics_state(tensor, state), 0.0)

    def _statistics_state(self, tensor: torch.Tensor, state: dict) -> dict:
        for key in self.history_keys:
            value = state.get(key)
            if value is None:
                state[key] = torch.zeros_like(tensor)
            elif value.device != tensor.device or value.dtype != tensor.dtype:
                state[key] = value.to(device=tensor.device, dtype=tensor.dtype)
        return state

    def _history_of(self, p: torch.Tensor, key: str, managed: set[int]) -> torch.Tensor:
        if id(p) in managed:
            return self._state(p)[key].detach().clone()
        entry = self._statistics.get(id(p))
        if entry is not None and entry[2]:
            return self._statistics_state(p, entry[2])[key].detach().clone()
        return torch.zeros_like(p)

    # -- Caffe's history blobs ----------------------------------------------------------------
    def _managed(self) -> set[int]:
        return {id(p) for g in self.param_groups for p in g["params"]}

    def history_blobs(self, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Caffe's ``history_`` for ``params`` (Caffe's learnable-param order); a tensor this
        optimizer does not update (a buffer) gets its ``track_statistics`` history, or zeros
        where none grew (Caffe's history of an lr_mult 0 blob without weight decay)."""
        managed = self._managed()
        return [self._history_of(p, key, managed) for key in self.history_keys for p in params]

    def load_history_blobs(
        self, params: Sequence[torch.Tensor], blobs: Sequence[torch.Tensor], iteration: int
    ) -> None:
        """Install a solverstate's history (``history_blobs`` order) and iteration count."""
        if len(blobs) != len(self.history_keys) * len(params):
            raise SolverError(
                "wrong number of history blobs",
                expected=f"{len(self.history_keys) * len(params)} history blobs",
                got=len(blobs),
            )
        managed = self._managed()
        it = iter(blobs)
        for key in self.history_keys:
            for p in params:
                value = next(it)
                copy = value.to(device=p.device, dtype=p.dtype).reshape(p.shape).clone()
                if id(p) in managed:
                    self._state(p)[key] = copy
                elif id(p) in self._statistics:
                    self._statistics[id(p)][2][key] = copy
        for p in params:
            if id(p) in managed:
                self.state[p]["step"] = int(iteration)
            elif id(p) in self._statistics:
                self._statistics[id(p)][2]["step"] = int(iteration)


class CaffeSGD(CaffeOptimizer):
    """Caffe's SGD: ``history = momentum*history + local_rate*grad``; step = history."""

    caffe_type = "SGD"
    history_moves_at_zero_rate = False

    def __init__(self, params, lr: float, momentum: float = 0.0, **kw: Any) -> None:
        super().__init__(params, lr, momentum=momentum, **kw)

    def _update(self, group, p, grad, state, local_rate):
        h = state["history"]
        h.mul_(_scalar(group["momentum"], p.dtype)).add_(grad, alpha=local_rate)
        grad.copy_(h)

    def _update_many(self, group, params, grads, states, local_rate):
        history = [state["history"] for state in states]
        torch._foreach_mul_(history, _scalar(group["momentum"], params[0].dtype))
        torch._foreach_add_(history, grads, alpha=local_rate)
        torch._foreach_copy_(grads, history)


class CaffeNesterov(CaffeSGD):
    """Nesterov: history as SGD; step = (1+momentum)*history - momentum*previous history."""

    caffe_type = "Nesterov"

    def _update(self, group, p, grad, state, local_rate):
        h = state["history"]
        momentum = _scalar(group["momentum"], p.dtype)
        previous = h.clone()
        h.mul_(momentum).add_(grad, alpha=local_rate)
        grad.copy_(h).mul_(_scalar(1.0 + momentum, p.dtype)).sub_(previous.mul_(momentum))

    def _update_many(self, group, params, grads, states, local_rate):
        history = [state["history"] for state in states]
        dtype = params[0].dtype
        momentum = _scalar(group["momentum"], dtype)
        previous = torch._foreach_mul(history, momentum)  # momentum * the previous history
        torch._foreach_mul_(history, momentum)
        torch._foreach_add_(history, grads, alpha=local_rate)
        torch._foreach_copy_(grads, history)
        torch._foreach_mul_(grads, _scalar(1.0 + momentum, dtype))
        torch._foreach_sub_(grads, previous)


class CaffeAdaGrad(CaffeOptimizer):
    """AdaGrad: ``history += grad**2``; step = local_rate * grad / (sqrt(history) + delta)."""

    caffe_type = "AdaGrad"

    def __init__(self, params, lr: float, delta: float = 1e-8, **kw: Any) -> None:
        super().__init__(params, lr, delta=delta, **kw)

    def _update(self, group, p, grad, state, local_rate):
        h = state["history"]
        h.add_(grad.square())
        grad.div_(h.sqrt().add_(_scalar(group["delta"], p.dtype))).mul_(local_rate)


class CaffeRMSProp(CaffeOptimizer):
    """RMSProp: ``history = rms_decay*history + (1-rms_decay)*grad**2``;
    step = local_rate * grad / (sqrt(history) + delta)."""

    caffe_type = "RMSProp"

    def __init__(
        self, params, lr: float, rms_decay: float = 0.99, delta: float = 1e-8, **kw: Any
    ) -> None:
        super().__init__(params, lr, rms_decay=rms_decay, delta=delta, **kw)

    def _update(self, group, p, grad, state, local_rate):
        h, decay = state["history"], group["rms_decay"]
        h.mul_(_scalar(decay, p.dtype)).add_(grad.square(), alpha=_one_minus(decay, p.dtype))
        grad.div_(h.sqrt().add_(_scalar(group["delta"], p.dtype))).mul_(local_rate)


class CaffeAdaDelta(CaffeOptimizer):
    """AdaDelta: gradient and update histories (``momentum`` is the decay); step =
    local_rate * grad * sqrt((update_history + delta) / (grad_history + delta))."""

    caffe_type = "AdaDelta"
    history_keys = ("history", "update_history")

    def __init__(
        self, params, lr: float, momentum: float = 0.0, delta: float = 1e-8, **kw: Any
    ) -> None:
        super().__init__(params, lr, momentum=momentum, delta=delta, **kw)

    def _update(self, group, p, grad, state, local_rate):
        h, hu = state["history"], state["update_history"]
        m = group["momentum"]
        keep, take = _scalar(m, p.dtype), _one_minus(m, p.dtype)
        delta = _scalar(group["delta"], p.dtype)
        h.mul_(keep).add_(grad.square(), alpha=take)
        ratio = (hu + delta).div_(h + delta).sqrt_()
        grad.mul_(ratio)
        hu.mul_(keep).add_(grad.square(), alpha=take)
        grad.mul_(local_rate)


class CaffeAdam(CaffeOptimizer):
    """Adam with Caffe's bias correction folded into the rate:
    step = local_rate * sqrt(1-beta2^t)/(1-beta1^t) * m / (sqrt(v) + delta), t = iter + 1."""

    caffe_type = "Adam"
    history_keys = ("m", "v")

    def __init__(
        self,
        params,
        lr: float,
        momentum: float = 0.9,
        momentum2: float = 0.999,
        delta: float = 1e-8,
        **kw: Any,
    ) -> None:
        super().__init__(params, lr, momentum=momentum, momentum2=momentum2, delta=delta, **kw)

    def _update(self, group, p, grad, state, local_rate):
        m, v = state["m"], state["v"]
        beta1, beta2 = _scalar(group["momentum"], p.dtype), _scalar(group["momentum2"], p.dtype)
        t = state.get("step", 0) + 1
        state["step"] = t
        correction = _adam_correction(beta1, beta2, t)
        rate = _scalar(local_rate * _scalar(correction, p.dtype), p.dtype)
        m.mul_(beta1).add_(grad, alpha=_one_minus(beta1, p.dtype))
        v.mul_(beta2).add_(grad.square(), alpha=_one_minus(beta2, p.dtype))
        grad.copy_(m).div_(v.sqrt().add_(_scalar(group["delta"], p.dtype))).mul_(rate)


def _adam_correction(beta1: float, beta2: float, t: int) -> float:
    """Caffe's ``sqrt(1 - pow(beta2, t)) / (1 - pow(beta1, t))`` in C's double arithmetic:
    NaN or inf for momentum2 > 1 or momentum 1 (the params go NaN, as in Caffe), where
    Python's math raises ValueError, ZeroDivisionError or OverflowError mid-training."""
    with np.errstate(all="ignore"):
        b1, b2 = np.float64(beta1), np.float64(beta2)
        one = np.float64(1.0)
        return float(np.sqrt(one - np.power(b2, t)) / (one - np.power(b1, t)))


def _batches(
    live: list[tuple[dict, torch.Tensor, torch.Tensor]],
) -> list[tuple[dict, list[torch.Tensor], list[torch.Tensor]]]:
    """``live`` (group, param, grad) rows split by group, dtype and device, in order."""
    out: dict[tuple[int, torch.dtype, torch.device], tuple[dict, list, list]] = {}
    for group, p, grad in live:
        key = (id(group), p.dtype, p.device)
        if key not in out:
            out[key] = (group, [], [])
        out[key][1].append(p)
        out[key][2].append(grad)
    return list(out.values())


OPTIMIZERS: dict[str, type[CaffeOptimizer]] = {
    cls.caffe_type: cls
    for cls in (CaffeSGD, CaffeNesterov, CaffeAdaGrad, CaffeRMSProp, CaffeAdaDelta, CaffeAdam)
}
