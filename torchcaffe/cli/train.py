"""Train a net with Caffe's solver semantics, as ``caffe train``.

    torchcaffe train --solver S.prototxt [--weights W.caffemodel[,W2]] [--snapshot S.solverstate]
                     [--gpu ID] [--level N] [--stage A,B] [--allow-python-layers] [--quiet]

File names inside the solver and its nets are relative to the working directory, as in Caffe.
``--snapshot`` resumes (ignoring the solver's ``weights``), ``--weights`` finetunes; not both.
Without ``--gpu``, ``solver_mode: GPU`` in the file selects the GPU (``device_id``); on a machine
without CUDA that falls back to the CPU with a warning. Ctrl-C stops after the current
iteration (and writes the final snapshot, as Caffe's sigint_effect=stop); SIGHUP snapshots.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator

import torch
from tqdm.contrib.logging import logging_redirect_tqdm

from .. import runtime
from ..errors import SolverError
from ..formats.prototxt import read_solver
from ..proto import caffe_pb2
from ..pycaffe.solver import SOLVER_CLASSES
from ..solver.solver import NONE, SNAPSHOT, STOP, Solver

log = logging.getLogger("torchcaffe.solver")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--solver", required=True, help="solver.prototxt")
    p.add_argument("--weights", help="caffemodel(s) to finetune from, comma-separated")
    p.add_argument("--snapshot", help=".solverstate (or .solverstate.h5) to resume from")
    p.add_argument("--gpu", type=int, help="CUDA device id (default: the solver's solver_mode)")
    p.add_argument("--level", type=int, default=0, help="train net state level")
    p.add_argument("--stage", default="", help="train net state stages, comma-separated")
    p.add_argument(
        "--allow-python-layers",
        action="store_true",
        help="run Python layers' code (only for models you trust)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-iteration log lines")


def main(args: argparse.Namespace) -> int:
    if args.snapshot and args.weights:
        raise SolverError(
            "give --snapshot to resume training or --weights to finetune, not both",
            path=args.solver,
        )
    param = read_solver(args.solver)
    param.train_state.level = args.level
    param.train_state.stage.extend(s for s in args.stage.split(",") if s)
    _select_device(param, args.gpu)
    if args.snapshot:
        param.ClearField("weights")
    elif args.weights:
        param.ClearField("weights")
        param.weights.append(args.weights)
    _configure_logging(args.quiet)
    cls = SOLVER_CLASSES.get(param.type, Solver)
    solver = cls(param, path=args.solver, allow_python_layers=args.allow_python_layers)
    with _signal_actions(solver), logging_redirect_tqdm(loggers=[log]):
        solver.solve(args.snapshot)
    print(
        f"trained {solver.net.name!r} to iteration {solver.iter}, loss {solver.smoothed_loss:.6g}"
    )
    return 0


def _select_device(param: caffe_pb2.SolverParameter, gpu: int | None) -> None:
    if gpu is None and param.solver_mode == caffe_pb2.SolverParameter.GPU:
        if not torch.cuda.is_available():
            log.warning("solver_mode: GPU but CUDA is not available; training on the CPU")
            runtime.set_mode_cpu()
            return
        gpu = param.device_id
    if gpu is None:
        runtime.set_mode_cpu()
        return
    runtime.set_device(gpu)
    runtime.set_mode_gpu()
    param.device_id = gpu


def _configure_logging(quiet: bool) -> None:
    if quiet or log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)


@contextlib.contextmanager
def _signal_actions(solver: Solver) -> Iterator[None]:
    """SIGINT -> stop, SIGHUP -> snapshot, read by the loop between iterations."""
    pending: list[str] = []

    def request() -> str:
        return pending.pop(0) if pending else NONE

    handlers = {signal.SIGINT: STOP}
    if hasattr(signal, "SIGHUP"):
        handlers[signal.SIGHUP] = SNAPSHOT
    previous = {}
    try:
        for sig, action in handlers.items():
            previous[sig] = signal.signal(sig, lambda *_, a=action: pending.append(a))
    except ValueError:  # not the main thread: leave signals alone
        previous = {}
    solver.action_request = request
    try:
        yield
    finally:
        solver.action_request = None
        for sig, handler in previous.items():
            signal.signal(sig, handler)
