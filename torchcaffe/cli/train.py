"""Train or finetune a net with Caffe's solver semantics, as ``caffe train``.

    torchcaffe train -solver S.prototxt [-weights W.caffemodel[,W2] | -snapshot S.solverstate]
                     [-gpu 0|0,1|all|-1] [-level N] [-stage A,B]
                     [-sigint_effect stop|snapshot|none] [-sighup_effect snapshot|stop|none]
                     [-allow_python_layers] [-quiet]

File names inside the solver and its nets are relative to the working directory, as in Caffe.
``-snapshot`` resumes (ignoring the solver's ``weights``), ``-weights`` finetunes; not both.
Without ``-gpu``, ``solver_mode: GPU`` in the file selects the GPU ``device_id``; on a machine
without CUDA that falls back to the CPU with a warning (an explicit ``-gpu`` is an error).
``-iterations`` is accepted and, as in Caffe, ignored: training runs to the solver's max_iter.
SIGINT and SIGHUP take effect between iterations (Caffe's defaults: stop, snapshot; ``stop``
still writes the final snapshot when snapshot_after_train is set); as in caffe.cpp they are
taken from before the solver is built, so one sent while the nets load acts after iteration 1.

Several processes: ``torchrun --nproc_per_node N -m torchcaffe train -solver S`` (gloo on the
CPU, NCCL with ``-gpu``), or ``-gpu 0,1`` / ``-gpu all``, which starts one process per GPU.
Each rank reads its own shard of the data; gradients are averaged as Caffe's multi-GPU solver
does, so the effective batch is N times the net's; only rank 0 tests, logs and snapshots.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator

import torch
from tqdm.contrib.logging import logging_redirect_tqdm

from ..errors import DeviceError, SolverError, TorchCaffeError, UsageError
from ..formats.prototxt import read_solver
from ..glog import on_stderr
from ..proto import caffe_pb2
from ..pycaffe.solver import SOLVER_CLASSES
from ..solver import distributed
from ..solver.solver import NONE, SNAPSHOT, STOP, Solver
from .devices import requested_gpus, use_device
from .flags import add_net_state_flags, require

log = logging.getLogger("torchcaffe.solver")
EFFECTS = (STOP, SNAPSHOT, NONE)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--solver", required=True, help="solver.prototxt")
    p.add_argument("--weights", help="caffemodel(s) to finetune from, comma-separated")
    p.add_argument("--snapshot", help=".solverstate (or .solverstate.h5) to resume from")
    p.add_argument("--gpu", default="", help="device ids, comma-separated, or 'all'")
    p.add_argument("--iterations", type=int, default=50, help="ignored by train (Caffe's flag)")
    add_net_state_flags(p, which="train net")
    p.add_argument("--sigint_effect", choices=EFFECTS, default=STOP, help="on SIGINT")
    p.add_argument("--sighup_effect", choices=EFFECTS, default=SNAPSHOT, help="on SIGHUP")
    p.add_argument("--quiet", action="store_true", help="no per-iteration log lines")


def main(args: argparse.Namespace) -> int:
    require(args.solver, "solver", "Need a solver definition to train")
    if args.snapshot and args.weights:
        raise SolverError(
            "give -snapshot to resume training or -weights to finetune, not both",
            path=args.solver,
        )
    if args.snapshot and not os.path.isfile(args.snapshot):
        raise SolverError("solver state file not found", path=args.snapshot)
    param = read_solver(args.solver)
    param.train_state.level = args.level
    param.train_state.stage.extend(s for s in args.stage.split(",") if s)
    gpus = _gpus(param, args.gpu)
    if len(gpus) > 1 and not distributed.launched_by_torchrun():
        return _spawn(args, gpus)
    group = None
    if distributed.launched_by_torchrun():
        group = distributed.init_from_env("nccl" if gpus else "gloo")
    gpu = rank_gpu(gpus, group)
    use_device(gpu)
    if gpu is not None:
        param.device_id = gpu
    if args.snapshot:
        param.ClearField("weights")
    elif args.weights:
        _check_weights_flag(args.weights)
        param.ClearField("weights")
        param.weights.append(args.weights)
    root = group is None or group.rank == 0
    cls = SOLVER_CLASSES.get(param.type, Solver)
    completed = False
    try:
        # the log is on before the solver is built, for what building it logs (Finetuning)
        with on_stderr(log, args.quiet or not root):  # parse_log.py reads glog's prefix
            log.info("Use CPU." if gpu is None else f"Using GPUs {', '.join(map(str, gpus))}")
            # caffe.cpp hooks SIGINT/SIGHUP before it builds the solver: a signal while the
            # nets load (a closed ssh session's SIGHUP) is a flag the first iteration reads
            with (
                _signal_actions(args.sigint_effect, args.sighup_effect) as request,
                logging_redirect_tqdm(loggers=[log]),
            ):
                solver = cls(
                    param, path=args.solver, allow_python_layers=args.allow_python_layers, root=root
                )
                if group is not None:
                    distributed.attach(solver, group)
                solver.action_request = request
                if args.snapshot:  # caffe.cpp restores here, then calls Solve() bare
                    log.info("Resuming from %s", args.snapshot)
                    solver.restore(args.snapshot)
                log.info("Starting Optimization")
                solver.solve()
                # caffe.cpp's own line after Solve returns, also after a stop
                log.info("Optimization Done.")
        completed = True
    finally:
        if group is not None:
            distributed.leave(completed)
    if root:
        print(
            f"trained {solver.net.name!r} to iteration {solver.iter}, "
            f"loss {solver.smoothed_loss:.6g}"
        )
    if group is not None:
        distributed.exit_completed_rank()
    return 0


def _check_weights_flag(value: str) -> None:
    """Each file -weights names exists: caffe.cpp puts the flag into the solver's weights,
    where a missing file would be blamed on the solver prototxt's field."""
    for name in (n.strip() for n in value.split(",")):
        if name and not os.path.isfile(name):
            raise UsageError(
                f"-weights: file {name!r} not found",
                expected="caffemodel files, comma-separated",
                hint=f"it is opened relative to the working directory {os.getcwd()}",
            )


def _gpus(param: caffe_pb2.SolverParameter, flag: str) -> list[int]:
    """Caffe's rule: ``-gpu`` wins; else ``solver_mode: GPU`` written in the file means
    ``[device_id]`` (caffe.cpp tests has_solver_mode(): the field's default GPU does not)."""
    mode_gpu = param.HasField("solver_mode") and param.solver_mode == param.GPU
    if flag.strip() == "" and mode_gpu:
        if not torch.cuda.is_available():
            log.warning("solver_mode: GPU but CUDA is not available; training on the CPU")
            return []
        return [param.device_id]
    return requested_gpus(flag)


def rank_gpu(gpus: list[int], group: distributed.ProcessGroup | None) -> int | None:
    """The GPU this process trains on: under torchrun, local rank r takes the r-th named
    GPU. Two ranks on one GPU would fail deep in NCCL ("Duplicate GPU detected"), so more
    processes per host than named GPUs is refused here."""
    if not gpus:
        return None
    if group is None:
        return gpus[0]
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", group.world_size))
    if per_host > len(gpus):
        raise DeviceError(
            f"{per_host} training processes on this host but {len(gpus)} GPU(s) named: "
            "NCCL needs one GPU per process",
            expected=f"-gpu with {per_host} ids (e.g. -gpu {','.join(map(str, range(per_host)))})",
            hint="or train on the CPU: solver_mode: CPU in the solver, and no -gpu",
        )
    return gpus[group.local_rank]


def _spawn(args: argparse.Namespace, gpus: list[int]) -> int:
    """``-gpu 0,1``: one process per GPU on this host, NCCL between them."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(_rank_main, args=(args, len(gpus), port), nprocs=len(gpus), join=True)
    except mp.ProcessExitedException as err:  # the rank printed its own error line
        return err.exit_code if err.exit_code and err.exit_code > 0 else 1
    return 0


def _rank_main(rank: int, args: argparse.Namespace, world_size: int, port: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )
    try:
        main(args)
    except TorchCaffeError as err:  # one line, as the CLI prints it (not spawn's traceback)
        print(f"torchcaffe train: error: rank {rank}: {err}", file=sys.stderr)
        sys.exit(2)


@contextlib.contextmanager
def _signal_actions(sigint_effect: str, sighup_effect: str) -> Iterator[Callable[[], str]]:
    """Caffe's SignalHandler: SIGINT/SIGHUP raise a flag the loop reads between iterations.
    As its CheckForSignals, one request per read, SIGHUP's before SIGINT's, and a signal
    that comes again before its flag is read counts once (an effect of ``none`` swallows
    the signal). Yields the reader, for ``Solver.action_request``."""
    effects = {signal.SIGINT: sigint_effect}
    if hasattr(signal, "SIGHUP"):
        effects = {signal.SIGHUP: sighup_effect, **effects}  # Caffe reads SIGHUP first
    raised = dict.fromkeys(effects, False)

    def request() -> str:
        for sig, effect in effects.items():
            if raised[sig]:
                raised[sig] = False
                return effect
        return NONE

    previous = {}
    try:
        for sig in effects:
            previous[sig] = signal.signal(
                sig, lambda s, _: raised.__setitem__(signal.Signals(s), True)
            )
    except ValueError:  # not the main thread: leave signals alone
        previous = {}
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
