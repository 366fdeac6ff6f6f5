"""One Caffe solver step vs a plain torch training step on the same net (LeNet, CaffeNet).

    python benchmarks/bench_solver_step.py [--nets lenet,caffenet] [--repeat 10]
                                           [--lenet-batch 64] [--caffenet-batch 16] [--threads N]
                                           [--clock wall|cpu] [--heap default|fixed]

Caffe side: ``caffe.SGDSolver`` (momentum 0.9, weight decay 5e-4, the nets' own lr_mult and
decay_mult) running ``step(1)``: Caffe's layer-by-layer forward/backward over blobs plus its
update rule. Baseline, in the same run: the compiled torch net (``torchcaffe.load``) with
``torch.optim.SGD`` (same momentum, ``torchcaffe.param_groups`` for the multipliers):
``zero_grad``, forward, ``total_loss(...).backward()``, ``step``. Both get the same random
batch through Input layers that replace the nets' data layers (they read no database here).
Prints medians and ranges (ms) and the ratio torch/solver: 1.00x means the solver costs
nothing over the plain loop; the target is >= 0.95x. The machine is noisy: read +-15%.
``--clock cpu`` times the process's CPU seconds instead of the wall clock: on a machine other
processes share, a step then does not count the time it waited for a core (with one thread;
with more, OpenMP's idle workers may spin and count too).
Each side's minor page faults per step are printed too (mean): a fresh heap page costs a
fault and a zeroing. Run alone (1 thread, LeNet b64), a loop step took none, a solver step
0 to ~900 depending on the process (glibc grows the heap and trims it back when what the
solver keeps in its blobs and records fragments it), ~2-3 ms of CPU at ~800. In turns in one
process the two sides change each other's heap, so read the counts as a clue, not a
property of one side. ``--heap fixed`` takes that lottery out for both sides alike: it fixes
glibc's thresholds (mallopt: nothing above 32 MiB is mmapped, the heap top is trimmed only past
1 GiB), so neither side faults and the ratio is the two steps' own cost.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torchcaffe  # noqa: E402
import torchcaffe as caffe  # noqa: E402
from torchcaffe.formats.prototxt import read_net  # noqa: E402
from torchcaffe.proto import caffe_pb2  # noqa: E402

MODELS = (REPO / ".." / "shared" / "models").resolve()  # the shared folder beside the checkout
NETS = {  # train_val prototxt, data shape after the transform, classes
    "lenet": (MODELS / "lenet_mnist" / "lenet_train_test.prototxt", (1, 28, 28), 10),
    "caffenet": (MODELS / "bvlc_reference_caffenet" / "train_val.prototxt", (3, 227, 227), 1000),
}
DATA_TYPES = {"Data", "ImageData", "HDF5Data", "MemoryData", "WindowData", "DummyData"}


def train_net_with_inputs(path: Path, batch: int, shape: tuple[int, ...]) -> caffe_pb2.NetParameter:
    """The TRAIN net with its data layers replaced by one Input of data + label."""
    net = read_net(str(path))
    out = caffe_pb2.NetParameter(name=net.name)
    out.state.phase = caffe_pb2.TRAIN
    replaced = False
    for layer in net.layer:
        if any(rule.phase == caffe_pb2.TEST for rule in layer.include):
            continue
        if layer.type in DATA_TYPES:
            if not replaced:
                inp = out.layer.add(name=layer.name, type="Input", top=list(layer.top))
                inp.input_param.shape.add(dim=[batch, *shape])
                inp.input_param.shape.add(dim=[batch])
                replaced = True
            continue
        out.layer.add().CopyFrom(layer)
    return out


def solver_param(net: caffe_pb2.NetParameter) -> caffe_pb2.SolverParameter:
    param = caffe_pb2.SolverParameter(
        type="SGD", base_lr=0.01, momentum=0.9, weight_decay=5e-4, lr_policy="fixed"
    )
    param.max_iter, param.display, param.snapshot, param.random_seed = 10**9, 0, 0, 1
    param.snapshot_after_train = False
    param.net_param.CopyFrom(net)
    return param


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers


def fix_heap() -> bool:
    """Fix glibc's malloc thresholds for this process (``--heap fixed``); False where the C
    library has no mallopt (not glibc) or refuses."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))


def minor_faults() -> int:
    """This process's minor page faults so far (0 where ``resource`` is missing: Windows)."""
    if resource is None:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed(step, clock=time.perf_counter) -> tuple[float, int]:
    """One call of ``step``: ms of ``clock``, minor page faults."""
    faults = minor_faults()
    start = clock()
    step()
    return (clock() - start) * 1e3, minor_faults() - faults


def bench(name: str, batch: int, repeat: int, clock=time.perf_counter) -> float:
    path, shape, classes = NETS[name]
    net_param = train_net_with_inputs(path, batch, shape)
    gen = np.random.default_rng(0)
    x = gen.standard_normal((batch, *shape)).astype(np.float32)
    y = gen.integers(0, classes, batch).astype(np.float32)

    solver = caffe.SGDSolver(solver_param(net_param), progress=False)

    def solver_step() -> None:
        solver.net.blobs["data"].data[...] = x
        solver.net.blobs["label"].data[...] = y
        solver.step(1)

    torch.manual_seed(1)
    tnet = torchcaffe.load(net_param, phase="train")
    opt = torch.optim.SGD(torchcaffe.param_groups(tnet, lr=0.01, weight_decay=5e-4), momentum=0.9)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def torch_step() -> None:
        opt.zero_grad()
        tnet.total_loss(tnet.forward_all_blobs(data=xt, label=yt)).backward()
        opt.step()

    # Alternate the two step by step so drifts in machine load hit both alike.
    for step in (solver_step, torch_step) * 2:  # warm-up: allocations, first-call paths
        step()
    caffe_times: list[float] = []
    torch_times: list[float] = []
    faults = [0, 0]  # solver, torch
    for _ in range(repeat):
        for times, side, step in ((caffe_times, 0, solver_step), (torch_times, 1, torch_step)):
            ms, n = timed(step, clock)
            times.append(ms)
            faults[side] += n
    c, t = statistics.median(caffe_times), statistics.median(torch_times)
    print(
        f"{name:9s} batch {batch:4d}  solver step {c:9.2f} ms [{min(caffe_times):.2f}, "
        f"{max(caffe_times):.2f}]  torch loop {t:9.2f} ms [{min(torch_times):.2f}, "
        f"{max(torch_times):.2f}]  ratio torch/solver {t / c:.2f}x  page faults/step "
        f"solver {faults[0] / repeat:.0f} torch {faults[1] / repeat:.0f}"
    )
    return t / c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nets", default="lenet,caffenet")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--lenet-batch", type=int, default=64)
    p.add_argument("--caffenet-batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    p.add_argument("--heap", choices=["default", "fixed"], default="default")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.heap == "fixed" and not fix_heap():
        sys.exit("--heap fixed: this C library has no mallopt (glibc only)")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU, {args.clock} clock, "
        f"{args.heap} heap"
    )
    for name in args.nets.split(","):
        bench(name, getattr(args, f"{name}_batch"), args.repeat, CLOCKS[args.clock])


if __name__ == "__main__":
    main()
