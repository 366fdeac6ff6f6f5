"""Data-parallel training (Caffe's multi-GPU semantics over torch.distributed, gloo on CPU):
two ranks with batch B train like one process with batch 2B, through the Caffe solver and
through DistributedDataParallel over the compiled net; rank 0 alone snapshots, and each rank's
HDF5Data reads its own interleaved shard."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from google.protobuf import text_format
from torch.nn.parallel import DistributedDataParallel

import torchcaffe
import torchcaffe as caffe
from tests.helpers.datasets import image_folder
from torchcaffe.errors import TorchCaffeError
from torchcaffe.ops.hdf5_data import HDF5DataLayer
from torchcaffe.ops.image_data import ImageDataLayer
from torchcaffe.proto import caffe_pb2
from torchcaffe.solver import distributed

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch without gloo")

NET = """
name: "tiny"
layer { name: "data" type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param { source: "list.txt" batch_size: BATCH } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""
SOLVER = (
    'net: "net{b}.prototxt" type: "SGD" base_lr: 0.1 momentum: 0.9 weight_decay: 0.01 '
    'lr_policy: "fixed" max_iter: {n} random_seed: 3 snapshot: 2 snapshot_prefix: "s{b}" '
    "snapshot_after_train: true solver_mode: CPU"  # gloo; Caffe's default mode is GPU
)
ITERS = 5


def write_setup(root: Path) -> None:
    """24 rows (not a multiple of the 8-row global batch: the stream wraps mid-batch)."""
    rng = np.random.default_rng(0)
    with h5py.File(root / "data.h5", "w") as f:
        f.create_dataset("data", data=rng.standard_normal((12, 5)).astype(np.float32))
        f.create_dataset("label", data=rng.integers(0, 3, 12).astype(np.float32))
    with h5py.File(root / "more.h5", "w") as f:
        f.create_dataset("data", data=rng.standard_normal((11, 5)).astype(np.float32))
        f.create_dataset("label", data=rng.integers(0, 3, 11).astype(np.float32))
    (root / "list.txt").write_text("data.h5\nmore.h5\n")
    for b in (4, 8):
        (root / f"net{b}.prototxt").write_text(NET.replace("BATCH", str(b)))
        (root / f"solver{b}.prototxt").write_text(SOLVER.format(b=b, n=ITERS))


def reference(root: Path) -> tuple[dict[str, list[np.ndarray]], list[float]]:
    """One process, batch 8: final params and each iteration's loss."""
    solver = caffe.get_solver(str(root / "solver8.prototxt"))
    losses: list[float] = []
    solver.add_callback(None, lambda: losses.append(float(solver.net.blobs["loss"].data)))
    solver.step(ITERS)
    params = {k: [b.data.copy() for b in v] for k, v in solver.net.params.items()}
    return params, losses


def torch_face_loop(batch: int, ddp: bool = False) -> list[np.ndarray]:
    """The torch face: a compiled net (wrapped in DistributedDataParallel when ``ddp``,
    sharded by ``shard_data``) trained by torch.optim.SGD; returns the final params."""
    torch.manual_seed(5)
    net = torchcaffe.load(f"net{batch}.prototxt", phase="train")
    model: torch.nn.Module = net
    if ddp:
        distributed.shard_data(net, dist.get_rank(), dist.get_world_size())
        model = DistributedDataParallel(net)
    opt = torch.optim.SGD(torchcaffe.param_groups(net, lr=0.1, weight_decay=0.01), momentum=0.9)
    for _ in range(ITERS):
        opt.zero_grad()
        model()["loss"].backward()
        opt.step()
    return [p.detach().numpy().copy() for p in net.parameters()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, root: str, port: int, results: dict) -> None:
    """One gloo rank: batch 4, records its losses and whether it wrote snapshots."""
    os.chdir(root)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        group = distributed.ProcessGroup(rank, 2, rank)
        solver = caffe.get_solver("solver4.prototxt", root=rank == 0)
        distributed.attach(solver, group)
        losses: list[float] = []
        solver.add_callback(None, lambda: losses.append(float(solver.net.blobs["loss"].data)))
        snapshots: list[str] = []
        original = solver.snapshot
        solver.snapshot = lambda: snapshots.append(original())  # type: ignore[method-assign]
        solver.solve()
        params = {k: [b.data.copy() for b in v] for k, v in solver.net.params.items()}
        results[rank] = (params, losses, snapshots, torch_face_loop(4, ddp=True))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_match_one_process_with_twice_the_batch(tmp_path, monkeypatch):
    write_setup(tmp_path)
    monkeypatch.chdir(tmp_path)
    want_params, want_losses = reference(tmp_path)
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(str(tmp_path), _free_port(), results), nprocs=2, join=True)
        results = dict(results)
    want_torch_face = torch_face_loop(8)
    for rank in (0, 1):
        for got, want in zip(results[rank][3], want_torch_face):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        params = results[rank][0]
        for name, blobs in want_params.items():
            for got, want in zip(params[name], blobs):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Each rank's loss is its half-batch mean; their average is the full batch's loss.
    mean = (np.array(results[0][1]) + np.array(results[1][1])) / 2
    np.testing.assert_allclose(mean, want_losses, rtol=1e-5)
    assert results[0][2] == [
        "s4_iter_2.solverstate",
        "s4_iter_4.solverstate",
        "s4_iter_5.solverstate",
    ]
    assert results[1][2] == []  # only the root solver snapshots


def test_torchrun_cli_trains_like_one_process_with_twice_the_batch(tmp_path, monkeypatch):
    write_setup(tmp_path)
    monkeypatch.chdir(tmp_path)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", "2", "-m", "torchcaffe", "train", "-solver"]
    command += ["solver4.prototxt", "-quiet"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    # the failing rank's own message comes first; torchrun's summary last
    assert done.returncode == 0, done.stderr[:4000] + "\n...\n" + done.stderr[-1500:]
    assert done.stdout.count("trained 'tiny' to iteration 5") == 1  # rank 0 reports
    want, _ = reference(tmp_path)
    got = caffe.Net("net4.prototxt", "s4_iter_5.caffemodel", caffe.TEST)
    for name, blobs in want.items():
        for blob, value in zip(got.params[name], blobs):
            np.testing.assert_allclose(blob.data, value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("world_size", [2, 3])
def test_hdf5_shards_interleave_the_single_stream(tmp_path, monkeypatch, world_size):
    """Rank r reads records r, r+W, r+2W, ... of the stream one process reads (Caffe's
    Skip()), across file boundaries and wrap-around."""
    write_setup(tmp_path)
    monkeypatch.chdir(tmp_path)

    def layer(batch: int) -> HDF5DataLayer:
        text = (
            'name: "d" type: "HDF5Data" top: "data" top: "label" '
            f'hdf5_data_param {{ source: "list.txt" batch_size: {batch} }}'
        )
        return HDF5DataLayer(text_format.Parse(text, caffe_pb2.LayerParameter()), [])

    whole = layer(3 * world_size)
    stream = torch.cat([whole.forward()[0] for _ in range(9)])
    for rank in range(world_size):
        shard = layer(3)
        shard.set_shard(rank, world_size)
        got = torch.cat([shard.forward()[0] for _ in range(9)])
        torch.testing.assert_close(got, stream[rank::world_size], rtol=0, atol=0)


@pytest.mark.parametrize("completed", [True, False])
def test_leave_waits_for_every_rank_only_after_a_completed_run(monkeypatch, completed):
    """A finished rank must not tear its connections down while rank 0 still writes the last
    snapshot (a peer's transport can abort); after an error a barrier could hang."""
    calls: list[str] = []
    real_barrier, real_destroy = dist.barrier, dist.destroy_process_group
    monkeypatch.setattr(
        dist, "barrier", lambda *a, **k: (calls.append("barrier"), real_barrier())[1]
    )
    monkeypatch.setattr(
        dist, "destroy_process_group", lambda *a, **k: (calls.append("destroy"), real_destroy())[1]
    )
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    distributed.leave(completed)
    assert not dist.is_initialized()
    assert calls == (["barrier", "destroy"] if completed else ["destroy"])
    distributed.leave(completed)  # not in a group any more: nothing to do
    assert len(calls) == (2 if completed else 1)


def _dropout_rank(rank: int, root: str, port: int, results: dict) -> None:
    """One gloo rank: the Dropout mask of its first forward after attach, and the rank and
    count that ``caffe.solver_rank()`` / ``caffe.solver_count()`` tell its Python layers."""
    os.chdir(root)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        solver = caffe.get_solver("solver_drop.prototxt", root=rank == 0)
        distributed.attach(solver, distributed.ProcessGroup(rank, 2, rank))
        solver.net.forward()
        mask = solver.net.blobs["dropped"].data == 0  # the data has no zeros
        results[rank] = (mask, caffe.solver_rank(), caffe.solver_count())
    finally:
        dist.destroy_process_group()


def test_ranks_draw_their_own_dropout_masks(tmp_path, monkeypatch):
    """Caffe's Solver::Init seeds each solver with ``random_seed + solver_rank``: ranks seeded
    alike would drop the same units of their different records every iteration."""
    write_setup(tmp_path)
    monkeypatch.chdir(tmp_path)
    drop = 'layer { name: "drop" type: "Dropout" bottom: "data" top: "dropped" }\n'
    net = NET.replace("BATCH", "4") + drop
    (tmp_path / "net_drop.prototxt").write_text(net)
    (tmp_path / "solver_drop.prototxt").write_text(
        'net: "net_drop.prototxt" base_lr: 0.1 lr_policy: "fixed" random_seed: 3 solver_mode: CPU'
    )
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_dropout_rank, args=(str(tmp_path), _free_port(), results), nprocs=2, join=True)
        results = dict(results)
    assert results[0][0].shape == (4, 5)
    assert not np.array_equal(results[0][0], results[1][0])
    # as Caffe::solver_rank() / solver_count() in each solver of a multi-GPU run
    assert [results[rank][1:] for rank in (0, 1)] == [(0, 2), (1, 2)]


def _mismatch_rank(rank: int, root: str, port: int, results: dict) -> None:
    """One gloo rank of a run whose rank 1 reads another net: the error each one raises."""
    os.chdir(root)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        solver = caffe.get_solver(f"solver{4 * (rank + 1)}.prototxt", root=rank == 0)
        try:
            distributed.attach(solver, distributed.ProcessGroup(rank, 2, rank))
        except TorchCaffeError as err:
            results[rank] = str(err)
    finally:
        dist.destroy_process_group()


def test_ranks_training_different_nets_fail_cleanly(tmp_path, monkeypatch):
    """Blobs of other sizes on another rank abort the process inside gloo (SIGABRT, no Python
    error); every rank is told instead."""
    write_setup(tmp_path)
    monkeypatch.chdir(tmp_path)
    net8 = (tmp_path / "net8.prototxt").read_text().replace("num_output: 4", "num_output: 5")
    (tmp_path / "net8.prototxt").write_text(net8)
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_mismatch_rank, args=(str(tmp_path), _free_port(), results), nprocs=2, join=True)
        results = dict(results)
    assert "rank 1 trains another net than rank 0" in results[0]
    assert "expected 4 learnable blobs of 39 values" in results[1]


def _dying_rank(rank: int, root: str, port: int, results: dict) -> None:
    """Rank 1 dies right after attach (exits without tearing its group down, as a failed
    rank would: a teardown racing rank 0's collective sometimes made gloo abort rank 1
    instead); rank 0 trains on."""
    os.chdir(root)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    solver = caffe.get_solver("solver4.prototxt", root=rank == 0)
    distributed.attach(solver, distributed.ProcessGroup(rank, 2, rank))
    if rank == 1:
        os._exit(0)
    try:
        solver.step(2)
    except TorchCaffeError as err:
        results[rank] = str(err)
    finally:
        dist.destroy_process_group()


def test_a_rank_that_dies_stops_its_peers_with_a_solver_error(tmp_path, monkeypatch):
    """The peers of a failed rank see gloo's transport error in the next collective: they
    stop with a TorchCaffeError that points at the failed rank (the CLI's one-line error)."""
    write_setup(tmp_path)
    monkeypatch.chdir(tmp_path)
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_dying_rank, args=(str(tmp_path), _free_port(), results), nprocs=2, join=True)
        results = dict(results)
    assert "another rank stopped during the gradient all-reduce" in results[0]


def test_image_data_ranks_mirror_on_their_own(tmp_path):
    """Caffe seeds solver r with ``random_seed + r``: ranks built from one seed must not
    mirror their records identically (every line here names the same image, so identical
    mirror draws would give identical batches)."""
    image_folder(tmp_path, [(6, 7)], gray=True)
    (tmp_path / "list.txt").write_text("".join(f"img_0.png {i}\n" for i in range(16)))
    text = (
        'name: "d" type: "ImageData" top: "data" top: "label" transform_param { mirror: true } '
        f'image_data_param {{ source: "{tmp_path}/list.txt" root_folder: "{tmp_path}/images/" '
        "batch_size: 8 is_color: false }"
    )
    batches = []
    for rank in (0, 1):
        torch.manual_seed(3)  # both ranks ran set_random_seed(random_seed) before building
        layer = ImageDataLayer(text_format.Parse(text, caffe_pb2.LayerParameter()), [])
        layer.set_shard(rank, 2)
        batches.append(layer.forward()[0])
        layer.close()
    assert not torch.equal(batches[0], batches[1])


def test_ranks_wait_for_rank_0_testing_longer_than_torchs_default(monkeypatch):
    """The other ranks wait in the all-reduce while rank 0 runs its test nets, which can take
    hours; torch's 30-minute default collective timeout would end the run (Caffe waits)."""
    seen: dict = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(kw))
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    distributed.init_from_env("gloo")
    assert seen["timeout"].total_seconds() >= 24 * 3600


def test_a_completed_rank_flushes_its_output_and_exits_without_teardown(monkeypatch):
    """The rank ends with os._exit(0) (torch's process-group teardown at interpreter exit
    could abort it), so what it printed is flushed first: os._exit drops buffers."""
    flushed = []

    class Stream:
        def __init__(self, name):
            self.name = name

        def flush(self):
            flushed.append(self.name)

    class Exited(Exception):
        pass

    def fake_exit(code):
        raise Exited(code)

    monkeypatch.setattr(sys, "stdout", Stream("stdout"))
    monkeypatch.setattr(sys, "stderr", Stream("stderr"))
    monkeypatch.setattr(distributed.os, "_exit", fake_exit)
    with pytest.raises(Exited) as exited:
        distributed.exit_completed_rank()
    assert exited.value.args == (0,)
    assert flushed[-2:] == ["stdout", "stderr"]  # after logging.shutdown's own flushes
