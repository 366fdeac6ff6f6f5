"""Data-parallel training over ``torch.distributed`` with Caffe's multi-GPU semantics.

Caffe's P2PSync/NCCL solver runs one solver per device: rank 0's weights are broadcast at the
start, every rank runs its own forward/backward on its own records, and before each update the
gradients are summed over ranks and scaled by ``1/world_size`` (parallel.cpp). The effective
batch is ``world_size * batch_size``; with Caffe's batch-normalised losses the averaged
gradient is the gradient of that larger batch. Only the root solver (rank 0) tests, displays
and snapshots. Data layers read records ``rank, rank + W, rank + 2W, ...`` (Caffe's Skip()):
every module of the train net that defines ``set_shard(rank, world_size)`` gets it called.

The Caffe-face solver computes gradients layer by layer (``torch.autograd.grad`` per layer),
so DistributedDataParallel's autograd hooks never fire on it; ``attach`` therefore performs
DDP's two collectives itself: the initial parameter broadcast and one flattened all-reduce of
the gradients per iteration (the bucketed all-reduce DDP does, at Caffe's callback point).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .. import runtime
from ..errors import DeviceError, SolverError

if TYPE_CHECKING:
    from .solver import Solver

ACTIONS = ("none", "stop", "snapshot")
# How long a rank waits in a collective for its peers. The other ranks wait in the gradient
# all-reduce while rank 0 tests (and at the end while it tests and snapshots), which can take
# hours on a large test set; torch's 30-minute default would end such a run, where Caffe's
# solvers wait as long as it takes. A peer that dies still fails the collective at once.
COLLECTIVE_TIMEOUT = datetime.timedelta(days=7)


@dataclass(frozen=True)
class ProcessGroup:
    """Where this process stands in a torch.distributed run."""

    rank: int
    world_size: int
    local_rank: int


def launched_by_torchrun() -> bool:
    """Whether the environment describes a multi-process run (torchrun's variables)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_from_env(backend: str) -> ProcessGroup:
    """Join the process group the environment describes (torchrun's RANK, WORLD_SIZE, ...)."""
    if backend == "nccl" and not dist.is_nccl_available():
        raise DeviceError("multi-GPU training needs NCCL, which this torch build lacks")
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    return ProcessGroup(
        dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0"))
    )


def leave(completed: bool) -> None:
    """Leave the process group. After a completed run every rank first waits at a barrier:
    a rank tearing its connections down while a peer still works (rank 0 writing the last
    snapshot) can take the peer's transport down with it. After an error no barrier is
    entered, since the failed peer may never reach it."""
    if not dist.is_initialized():
        return
    if completed:
        dist.barrier()
    dist.destroy_process_group()


def exit_completed_rank() -> NoReturn:
    """End a torchrun rank whose run completed and which left its group (``leave``): its
    logs and output flushed, then ``os._exit(0)``, without the interpreter's teardown. There
    torch's process-group objects are destroyed with the rest, and a rank sometimes aborted
    ("terminate called without an active exception", SIGABRT, with no Python frame left:
    2 runs of 12 of the two-rank CLI test on a loaded 2-core host), failing a run whose work
    and snapshots were done."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken pipe: nothing to keep
            stream.flush()
    os._exit(0)


def shard_data(module: torch.nn.Module, rank: int, world_size: int) -> int:
    """Call ``set_shard(rank, world_size)`` on every submodule that has it; returns how many."""
    count = 0
    for sub in module.modules():
        set_shard = getattr(sub, "set_shard", None)
        if callable(set_shard):
            set_shard(rank, world_size)
            count += 1
    return count


def _learned(solver: Solver) -> list[torch.Tensor]:
    return [e.tensor for e in solver._learnables]


def _grads(solver: Solver) -> list[torch.Tensor]:
    grads = []
    for entry in solver._learnables:
        grad = entry.tensor.grad if entry.optimized else None
        if grad is not None:
            grads.append(grad)
    return grads


@contextlib.contextmanager
def _peers(solver: Solver, what: str) -> Iterator[None]:
    """A collective whose peer is gone (it crashed or stopped at its own error) fails in the
    transport: say so as a SolverError, not as gloo's or NCCL's traceback."""
    try:
        yield
    except RuntimeError as err:  # DistBackendError, gloo's "Connection closed by peer"
        raise SolverError(
            f"another rank stopped during the {what}; see that rank's own error",
            path=solver.path,
            got=str(err).splitlines()[0] if str(err) else type(err).__name__,
        ) from err


def _backend_device(solver: Solver) -> torch.device:
    """Where this backend's collectives take their tensors (NCCL: the GPU; gloo: the CPU)."""
    device = solver.net._ensure_device()
    return device if dist.get_backend() == "nccl" else torch.device("cpu")


def check_same_net(solver: Solver) -> None:
    """Every rank must train the same learnable blobs: a flattened broadcast or all-reduce
    over blobs of other sizes aborts the process inside gloo/NCCL, with no Python error."""
    learned = solver._learnables
    layout = ";".join(
        f"{e.layer}.{e.index}{tuple(e.tensor.shape)}{e.tensor.dtype}" for e in learned
    )
    counts = (len(learned), sum(e.tensor.numel() for e in learned), zlib.crc32(layout.encode()))
    mine = torch.tensor(counts, dtype=torch.int64, device=_backend_device(solver))
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    with _peers(solver, "check that every rank trains the same net"):
        dist.all_gather(everyone, mine)
    root = everyone[0].tolist()
    for rank, theirs in enumerate(t.tolist() for t in everyone):
        if theirs != root:
            raise SolverError(
                f"rank {rank} trains another net than rank 0 (its learnable blobs differ)",
                path=solver.path,
                expected=f"{root[0]} learnable blobs of {root[1]} values, as rank 0's",
                got=f"{theirs[0]} blobs of {theirs[1]} values",
                hint="every rank must read the same solver and net files",
            )


def broadcast_params(solver: Solver, src: int = 0) -> None:
    """Make every rank start from ``src``'s weights (Caffe's NCCL::Broadcast)."""
    solver.net._ensure_device()
    tensors = [t.data for t in _learned(solver)]
    if not tensors:
        return
    flat = _flatten_dense_tensors(tensors)
    with _peers(solver, "broadcast of the initial weights"):
        dist.broadcast(flat, src)
    for t, synced in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
        t.copy_(synced)
    solver.net._params_written_on_device()


def average_gradients(solver: Solver) -> None:
    """Sum every param gradient over ranks and scale by ``1/world_size`` (parallel.cpp)."""
    solver.net._ensure_device()  # host-side diff edits reach the module's grads
    grads = _grads(solver)
    if not grads:
        return
    world = dist.get_world_size()
    for dtype in dict.fromkeys(g.dtype for g in grads):
        group = [g for g in grads if g.dtype == dtype]
        flat = _flatten_dense_tensors(group)
        with _peers(solver, "gradient all-reduce"):
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.mul_(1.0 / world)
        for g, synced in zip(group, _unflatten_dense_tensors(flat, group)):
            g.copy_(synced)
    solver.net._params_written_on_device(diff=True)


def rank0_request(solver: Solver) -> Callable[[str], str]:
    """Rank 0's action request (its signals), broadcast so every rank stops together."""
    backend_device = _backend_device(solver)

    def sync(request: str) -> str:
        code = torch.zeros(1, dtype=torch.int64, device=backend_device)
        if dist.get_rank() == 0:
            code[0] = ACTIONS.index(request)
        with _peers(solver, "broadcast of rank 0's stop/snapshot request"):
            dist.broadcast(code, 0)
        return ACTIONS[int(code[0])]

    return sync


def seed_rank(solver: Solver, rank: int) -> None:
    """Give rank ``rank`` its own random stream, as Caffe's Solver::Init seeds each solver with
    ``random_seed + solver_rank``: ranks seeded alike would draw the same Dropout masks every
    iteration. Rank 0 keeps the stream a single process has (Caffe's root adds 0)."""
    if rank == 0:
        return
    seed = solver.param.random_seed if solver.param.random_seed >= 0 else torch.initial_seed()
    runtime.set_random_seed((seed + rank) % 2**64)  # torch takes 64-bit seeds


def attach(solver: Solver, group: ProcessGroup) -> None:
    """Make ``solver`` one rank of a data-parallel run (see the module docstring)."""
    from .solver import Callback

    solver.root = group.rank == 0
    # Caffe::solver_count() / solver_rank(), as this rank's Python layers read them
    runtime.set_solver_count(group.world_size)
    runtime.set_solver_rank(group.rank)
    runtime.set_multiprocess(True)
    shard_data(solver.net.module, group.rank, group.world_size)
    check_same_net(solver)
    broadcast_params(solver)
    seed_rank(solver, group.rank)
    solver.add_callback(Callback(on_gradients_ready=lambda: average_gradients(solver)))
    solver.sync_request = rank0_request(solver)
