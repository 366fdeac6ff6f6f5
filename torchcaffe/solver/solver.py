"""Caffe's Solver loop over the Caffe-face net: step, solve, test, snapshot, restore.

The loop is Caffe's Solver::Step: clear param diffs, test at ``test_interval``, run
``iter_size`` forward/backward passes (diffs accumulate), smooth the loss over
``average_loss`` iterations, display, apply the update (the torch optimizer of the solver
type plus the lr policy's scheduler), snapshot every ``snapshot`` iterations. The nets are
``caffe.Net`` objects, so ``solver.net.blobs[...]`` and ``solver.net.params[...]`` read as in
pycaffe, and forward/backward are Caffe's layer-by-layer passes.
"""

from __future__ import annotations

import contextlib
import logging
import numbers
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import runtime
from ..errors import UsageError, WeightsError
from ..formats.user_schema import use_schema
from ..proto import caffe_pb2
from ..pycaffe.net import Net
from .config import check_solver_param, field_error, load_solver_param
from .evaluation import log_outputs, run_test, weighted_loss
from .factory import make_lr_policy, make_optimizer
from .nets import build_test_nets, build_train_net
from .param_groups import learnable_params
from .state import (
    SolverSnapshot,
    read_solverstate,
    write_solverstate,
    write_solverstate_hdf5,
)

log = logging.getLogger("torchcaffe.solver")
PathLike = str | os.PathLike
HDF5 = caffe_pb2.SolverParameter.HDF5

# What an action request (Caffe's SolverAction, e.g. from a signal handler) may ask.
NONE, STOP, SNAPSHOT = "none", "stop", "snapshot"


class Callback:
    """pycaffe's solver callback: ``on_start`` before each iteration's passes,
    ``on_gradients_ready`` before the update."""

    def __init__(
        self,
        on_start: Callable[[], Any] | None = None,
        on_gradients_ready: Callable[[], Any] | None = None,
    ) -> None:
        self.on_start = on_start or (lambda: None)
        self.on_gradients_ready = on_gradients_ready or (lambda: None)


class Solver:
    """A Caffe solver from ``solver.prototxt`` (or a SolverParameter).

    ``solver_type`` fixes the update rule (as pycaffe's ``SGDSolver(path)`` ignores the
    file's ``type``); ``None`` takes it from the file, as ``caffe.get_solver``.
    ``progress``: a tqdm bar over long ``step``/``solve`` calls (None: only on a terminal).
    ``path`` names the file a given SolverParameter came from, for error messages.
    ``root``: Caffe's root solver; in a multi-process run only the root (rank 0) tests,
    snapshots and displays, as Caffe's ``Caffe::root_solver()`` checks.
    """

    solver_type: ClassVar[str | None] = None

    def __init__(
        self,
        solver: PathLike | caffe_pb2.SolverParameter,
        *,
        allow_python_layers: bool = False,
        progress: bool | None = None,
        path: PathLike | None = None,
        root: bool = True,
        caffe_proto: PathLike | None = None,
    ) -> None:
        with use_schema(caffe_proto):  # a fork's caffe.proto (docs/forks.md)
            param, path_read = load_solver_param(solver)
            path = path_read if path is None else os.fspath(path)  # path: names an edited param
            self.type = self.solver_type or param.type
            check_solver_param(param, path, self.type)
            self.param, self.path, self.progress = param, path, progress
            self.root = root
            self._iter = 0
            if param.random_seed >= 0:
                runtime.set_random_seed(param.random_seed)
            self._check_snapshot_prefix()
            options = {"allow_python_layers": allow_python_layers}
            self.net: Net = build_train_net(param, path, **options)
            self.test_nets: list[Net] = build_test_nets(param, path, **options)
        for test_net in self.test_nets:  # Caffe's InitTestNets: the solver's flag wins
            test_net._debug_info = param.debug_info
        self._learnables = learnable_params(self.net.module)
        self._net_binds_seen = self.net._binds
        self.optimizer = make_optimizer(param, self._learnables, self.type)
        self.scheduler = make_lr_policy(param, self.optimizer)
        self._losses: list[np.float32] = []
        self.smoothed_loss: float | np.float32 = 0.0
        self.test_scores: list[OrderedDict[str, np.ndarray]] = []
        self.requested_early_exit = False
        self.action_request: Callable[[], str] | None = None
        # Multi-process runs: turns this rank's request into the one every rank acts on.
        self.sync_request: Callable[[str], str] | None = None
        self._callbacks: list[Callback] = []

    # -- pycaffe attributes ---------------------------------------------------------------
    @property
    def iter(self) -> int:
        """The number of updates applied so far."""
        return self._iter

    @property
    def lr(self) -> float:
        """The learning rate of the current iteration (before lr_mult)."""
        self._follow_base_lr()
        return self.scheduler.lr

    def _follow_base_lr(self) -> None:
        """Rate the current iteration from ``param.base_lr`` as it is now: Caffe's
        GetLearningRate reads it on every update, and pycaffe scripts set it
        (``solver.param.base_lr = ...``) between steps."""
        base = float(self.param.base_lr)
        scheduler = self.scheduler
        if all(b == base for b in scheduler.base_lrs):
            return
        scheduler.base_lrs = [base] * len(scheduler.base_lrs)
        rate = scheduler.rate(base, scheduler.last_epoch)
        for group in self.optimizer.param_groups:
            group["initial_lr"], group["lr"] = base, rate

    def add_callback(
        self,
        on_start: Callable[[], Any] | Callback,
        on_gradients_ready: Callable[[], Any] | None = None,
    ) -> None:
        cb = on_start if isinstance(on_start, Callback) else Callback(on_start, on_gradients_ready)
        self._callbacks.append(cb)

    def _follow_net_params(self) -> None:
        """The train net took other param tensors (``net.share_with``): the update and its
        history move to them, as Caffe's solver updates the net's learnable blobs whatever
        memory they were given."""
        if self._net_binds_seen == self.net._binds:
            return
        self._net_binds_seen = self.net._binds
        learnables = learnable_params(self.net.module)
        swap = {
            id(old.tensor): (old.tensor, new.tensor)
            for old, new in zip(self._learnables, learnables)
            if old.tensor is not new.tensor
        }
        self._learnables = learnables
        if not swap:
            return
        for group in self.optimizer.param_groups:
            group["params"] = [swap[id(p)][1] if id(p) in swap else p for p in group["params"]]
        state = self.optimizer.state
        for old, new in swap.values():
            if old in state:
                state[new] = state.pop(old)
            self.optimizer.retarget_statistics(old, new)

    def share_weights(self, net: Net) -> None:
        """Let ``net`` use this solver's train-net params (pycaffe's share_weights)."""
        net.share_with(self.net)

    # -- the loop -------------------------------------------------------------------------
    def step(self, iters: int) -> None:
        """Caffe's Solver::Step: ``iters`` iterations (each one update).

        ``iters`` must be a whole number: pycaffe's ``step(int)`` refuses a float with a
        TypeError, where truncating ``step(2.5)`` would silently train fewer iterations."""
        if not isinstance(iters, numbers.Integral):
            raise UsageError(
                "step takes a whole number of iterations", expected="an int", got=repr(iters)
            )
        p = self.param
        start_iter, stop_iter = self._iter, self._iter + int(iters)
        self._losses, self.smoothed_loss = [], 0.0
        timer, last = time.perf_counter(), self._iter
        with self._progress_bar(int(iters)) as bar:
            # One pass and nothing in between that could read the diffs: clear them fused
            # into the forward/backward (the test nets do not touch them).
            fused = p.iter_size == 1 and not self._callbacks
            while self._iter < stop_iter:
                if not fused:
                    self.net.clear_param_diffs()
                if (
                    self.root
                    and p.test_interval
                    and self._iter % p.test_interval == 0
                    and (self._iter > 0 or p.test_initialization)
                ):
                    self.test_all()
                    if self.requested_early_exit and self.sync_request is None:
                        if fused:
                            self.net.clear_param_diffs()
                        break
                for cb in self._callbacks:
                    cb.on_start()
                display = self.root and bool(p.display) and self._iter % p.display == 0
                self.net._debug_info = display and p.debug_info  # as Caffe's Step sets it
                if fused:
                    loss = self.net._clear_and_forward_backward()
                else:
                    loss = np.float32(0.0)  # Step's Dtype loss
                    for _ in range(p.iter_size):
                        loss += np.float32(self.net.forward_backward())
                    loss /= np.float32(p.iter_size)
                self._update_smoothed_loss(loss, start_iter)
                if display:
                    lapse = time.perf_counter() - timer
                    self._display(lapse, self._iter - last)
                    timer, last = time.perf_counter(), self._iter
                for cb in self._callbacks:
                    cb.on_gradients_ready()
                self.apply_update()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{self.smoothed_loss:.4g}", refresh=False)
                request = self._requested()
                if self.sync_request is not None:  # every rank stops at the same iteration
                    request = self.sync_request(STOP if self.requested_early_exit else request)
                scheduled = p.snapshot and self._iter % p.snapshot == 0
                if self.root and (scheduled or request == SNAPSHOT):
                    self.snapshot()
                if request == STOP:
                    self.requested_early_exit = True
                    break

    def _progress_bar(self, iters: int) -> contextlib.AbstractContextManager[tqdm | None]:
        """A tqdm bar over ``iters`` iterations, or None where none would show (one
        iteration, ``progress=False``): a disabled tqdm still costs its construction and
        two calls per iteration (about 10 us, paid by every ``step(1)``)."""
        if iters < 2 or self.progress is False:
            return contextlib.nullcontext()
        disable = None if self.progress is None else False  # None: tty only
        return tqdm(total=iters, unit="iter", desc="train", leave=False, disable=disable)

    def apply_update(self) -> None:
        """Caffe's ApplyUpdate: clip, normalize, regularize, update, then ``iter += 1``."""
        p = self.param
        self._follow_base_lr()
        if self.root and p.display and self._iter % p.display == 0:
            log.info("Iteration %d, lr = %g", self._iter, self.lr)
        self.net._ensure_device()  # host-side edits of diffs reach the module's tensors
        self._follow_net_params()
        self.optimizer.step()
        self.net._params_written_on_device(diff=True)
        self.scheduler.step()
        self._iter += 1

    def solve(self, resume_file: PathLike | None = None) -> None:
        """Caffe's Solve: (restore,) step to max_iter, final snapshot, display and test."""
        p = self.param
        log.info("Solving %s", self.net.module.name)  # Caffe logs its own name, not a script's
        log.info("Learning Rate Policy: %s", p.lr_policy)
        self.requested_early_exit = False
        if resume_file is not None:
            log.info("Restoring previous solver status from %s", os.fspath(resume_file))
            self.restore(resume_file)
        start_iter = self._iter
        if p.snapshot_after_train:  # written after the last step: fail before the first
            self._check_snapshot_prefix(after_train=True)
        self.step(p.max_iter - self._iter)
        if not self.root:  # Caffe's workers only Step; the root finishes the run
            return
        if p.snapshot_after_train and (not p.snapshot or self._iter % p.snapshot != 0):
            self.snapshot()
        if self.requested_early_exit:
            log.info("Optimization stopped early.")
            return
        if p.display and self._iter % p.display == 0:
            self.net.forward()
            self._update_smoothed_loss(weighted_loss(self.net), start_iter)
            log.info("Iteration %d, loss = %g", self._iter, self.smoothed_loss)
        if p.test_interval and self._iter % p.test_interval == 0:
            self.test_all()
        log.info("Optimization Done.")

    def _requested(self) -> str:
        return self.action_request() if self.action_request is not None else NONE

    def _update_smoothed_loss(self, loss: float, start_iter: int) -> None:
        """Solver::UpdateSmoothedLoss, in float as Caffe's Dtype (the displayed loss's digits)."""
        average = self.param.average_loss
        value = np.float32(loss)
        smoothed = np.float32(self.smoothed_loss)
        if len(self._losses) < average:
            self._losses.append(value)
            n = len(self._losses)
            self.smoothed_loss = (smoothed * np.float32(n - 1) + value) / np.float32(n)
        else:
            idx = (self._iter - start_iter) % average
            self.smoothed_loss = smoothed + (value - self._losses[idx]) / np.float32(average)
            self._losses[idx] = value

    def _display(self, lapse: float, iters: int) -> None:
        # Caffe streams the float lapse and rate as they are (6 significant digits)
        log.info(
            "Iteration %d (%g iter/s, %gs/%d iters), loss = %g",
            self._iter,
            iters / (lapse or 1.0),
            lapse,
            self.param.display,
            self.smoothed_loss,
        )
        log_outputs(
            self.net, "Train", {n: self.net.blobs[n].data.ravel() for n in self.net.outputs}
        )

    # -- testing --------------------------------------------------------------------------
    def test_all(self) -> list[OrderedDict[str, np.ndarray]]:
        """Caffe's TestAll; returns (and keeps in ``test_scores``) each net's mean outputs."""
        self.test_scores = []
        for i in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            self.test_scores.append(self.test(i))
        return self.test_scores

    def test(self, index: int = 0) -> OrderedDict[str, np.ndarray]:
        """Caffe's Test: share the trained params, forward test_iter times, average."""
        return run_test(self, index)

    # -- snapshots ------------------------------------------------------------------------
    def _filename(self, extension: str) -> str:
        return f"{self.param.snapshot_prefix}_iter_{self._iter}{extension}"

    def _check_snapshot_prefix(self, after_train: bool = False) -> None:
        """Caffe's CheckSnapshotWritePermissions: fail now, not after hours of training. Caffe
        checks at construction for ``snapshot`` only; ``solve`` checks again (``after_train``)
        for the snapshot_after_train one (a script that only steps never writes it)."""
        if not (self.param.snapshot or after_train) or not self.root:
            return
        probe = self._filename(".tempfile")
        try:
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError as err:
            raise field_error(
                self.path,
                "snapshot_prefix",
                f"cannot write snapshots under {self.param.snapshot_prefix!r} ({err.strerror})",
                hint="make sure the directory exists and is writable",
            ) from None

    def snapshot(self) -> str:
        """Write ``<prefix>_iter_<N>.caffemodel`` and ``.solverstate`` (or their .h5 forms);
        returns the solver state's file name."""
        hdf5 = self.param.snapshot_format == HDF5
        model = self._filename(".caffemodel.h5" if hdf5 else ".caffemodel")
        self._follow_net_params()
        kind = "HDF5" if hdf5 else "binary proto"
        log.info("Snapshotting to %s file %s", kind, model)
        (self.net.save_hdf5 if hdf5 else self.net.save)(model, write_diff=self.param.snapshot_diff)
        history = self.optimizer.history_blobs([e.tensor for e in self._learnables])
        snap = SolverSnapshot(
            self._iter,
            self.scheduler.snapshot_step,
            model,
            [h.detach().cpu().numpy() for h in history],
        )
        state_file = self._filename(".solverstate.h5" if hdf5 else ".solverstate")
        log.info("Snapshotting solver state to %s file %s", kind, state_file)
        (write_solverstate_hdf5 if hdf5 else write_solverstate)(state_file, snap)
        return state_file

    def restore(self, state_file: PathLike) -> None:
        """Caffe's Restore: iteration, learned net, lr policy step and history."""
        name = os.fspath(state_file)
        shapes = [tuple(e.tensor.shape) for e in self._learnables]
        snap = read_solverstate(name, expected_shapes=shapes * len(self.optimizer.history_keys))
        if snap.learned_net:
            if not os.path.exists(snap.learned_net):  # name the state that points at it
                raise WeightsError(
                    f"its learned_net {snap.learned_net!r} is not found",
                    path=name,
                    hint="Caffe opens it as written, relative to the working directory "
                    f"{os.getcwd()}: resume from the directory the snapshot was taken in",
                )
            self.net.copy_from(snap.learned_net)
        self._iter = snap.iter
        self.net._ensure_device()
        self._follow_net_params()
        tensors = [e.tensor for e in self._learnables]
        self.optimizer.load_history_blobs(
            tensors, [torch.from_numpy(np.asarray(h)) for h in snap.history], snap.iter
        )
        self.scheduler.restore(snap.iter, snap.current_step)

    def __repr__(self) -> str:
        return (
            f"<caffe.{type(self).__name__} type={self.type} iter={self._iter} "
            f"net={self.net.name!r} test_nets={len(self.test_nets)}>"
        )
