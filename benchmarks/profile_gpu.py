"""Where a GPU eager run's time goes, ours against the hand-written model (issue 14: where a
target is missed, show the profile).

    python benchmarks/profile_gpu.py [--nets GoogLeNet,...] [--rounds 30] [--tops 14] [--compiled]

For each net, inference at batch 1 and forward+backward at batch 8, both sides in IEEE
float32 (``caffe_float32``), printed per side:
- the synced time per call, and the host's time alone (the call returns before the GPU is
  done: where host time >= synced time, the run is bound by the host's launches);
- the GPU's kernel time and the kernel launches per call (``torch.profiler``);
- with ``--tops``, the torch profiler's ops by self CPU time and cProfile's Python functions
  by own time.
Then the Caffe face's forward in GPU mode against the torch face plus its copies, at batch 1,
with the Caffe face's cProfile tops.
A diagnostic, not the table of record (``run.py --device cuda`` is): one process, median and
range of ``--rounds`` calls after warm-up.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.autograd import DeviceType

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torchcaffe  # noqa: E402
from benchmarks.bench_caffe_face import caffe_face, face_calls  # noqa: E402
from benchmarks.handwritten import NETS  # noqa: E402
from benchmarks.run import inference_calls, interleaved, prepare, synced  # noqa: E402

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel")


def call_times(fn: Callable[[], object], rounds: int, sync: bool) -> str:
    """Median [min-max] ms per call of ``fn``; with ``sync`` the wait for the GPU is in it."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    ms = [s * 1e3 for s in seconds]
    return f"{statistics.median(ms):.3f} ms [{min(ms):.3f}-{max(ms):.3f}]"


def kernel_profile(
    fn: Callable[[], object], calls: int, tops: int, sort_by: str = "self_cpu_time_total"
) -> str:
    """Kernel time and launches per call, and (``tops`` > 0) the ops by ``sort_by``."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    # the kernels' own events, as the profiler's table totals them: an op's event carries its
    # kernels' time too, so summing every event counts each kernel twice
    kernels = [
        e
        for e in events
        if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]
    kernel_ms = sum(e.self_device_time_total for e in kernels) / calls / 1e3
    launches = sum(e.count for e in events if e.key in LAUNCHES) / calls
    text = f"kernels {kernel_ms:.3f} ms a call, {launches:.0f} launches a call"
    if tops:
        table = events.table(sort_by=sort_by, row_limit=tops)
        text += "\n" + table
    return text


def python_profile(fn: Callable[[], object], calls: int, tops: int) -> str:
    """cProfile's ``tops`` functions by own time over ``calls`` calls."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(tops)
    return out.getvalue()


def profile_compiled(name: str, rounds: int, tops: int) -> None:
    """``torch.compile`` of both sides at inference batch 1 (the compiled fwd+bwd's compile
    does not fit a device call): dynamo's graphs and breaks on the device, then per side the
    synced and host-only times, the kernels, and with ``tops`` the kernels by device time."""
    device = torch.device("cuda")
    net, hand, out, size, _ = prepare(name, device)
    x1 = torch.randn(1, 3, size, size, device=device)
    with torch.inference_mode():
        report = torch._dynamo.explain(net)(data=x1)
    print(f"== {name} compiled: {report.graph_count} graph(s), {report.graph_break_count} breaks")
    for reason in report.break_reasons[:5]:
        print("  ", str(reason.reason)[:200])
    torch._dynamo.reset()
    infer_ours, infer_hand = inference_calls(torch.compile(net), torch.compile(hand), x1)
    for side, fn in (("ours", infer_ours), ("hand-written", infer_hand)):
        print(f"== {name} compiled inference b1, {side}")
        print(f"synced {call_times(fn, rounds, True)}, host {call_times(fn, rounds, False)}")
        print(kernel_profile(fn, 5, tops, sort_by="self_cuda_time_total"))
        if tops:
            print(python_profile(fn, 10, tops))
        sys.stdout.flush()
    # run.py times the sides alternated, after eager fwd+bwd steps of the same modules (the
    # H200 reading of 2026-11-30: ours 6.6 ms there, 4.0 ms back to back above)
    both = alternated(infer_ours, infer_hand, rounds)
    print(f"== {name} compiled inference b1, alternated: {both}")
    x8 = torch.randn(8, 3, size, size, device=device)
    weights = torch.randn(8, 1000, device=device)
    for module, call in ((net, lambda: net(data=x8)[out]), (hand, lambda: hand(x8))):
        for _ in range(2):
            module.zero_grad(set_to_none=True)
            (call().reshape(8, -1) * weights).sum().backward()
    print(
        f"== {name} compiled inference b1, alternated after eager fwd+bwd steps: "
        f"{alternated(infer_ours, infer_hand, rounds)}"
    )


def alternated(a: Callable[[], object], b: Callable[[], object], rounds: int) -> str:
    """Synced median [min-max] ms of ``a`` and of ``b``, called in turn as ``run.py`` times
    its rows (``interleaved``)."""
    device = torch.device("cuda")
    times = interleaved(synced(a, device), synced(b, device), rounds)
    return " against ".join(
        f"{statistics.median(s) * 1e3:.3f} ms [{min(s) * 1e3:.3f}-{max(s) * 1e3:.3f}]"
        for s in times
    )


def profile_net(name: str, rounds: int, tops: int) -> None:
    device = torch.device("cuda")
    net, hand, out, size, _ = prepare(name, device)
    x1 = torch.randn(1, 3, size, size, device=device)
    x8 = torch.randn(8, 3, size, size, device=device)
    weights = torch.randn(8, 1000, device=device)
    infer_ours, infer_hand = inference_calls(net, hand, x1)

    def step_ours() -> None:
        net.zero_grad(set_to_none=True)
        (net(data=x8)[out].reshape(8, -1) * weights).sum().backward()

    def step_hand() -> None:
        hand.zero_grad(set_to_none=True)
        (hand(x8).reshape(8, -1) * weights).sum().backward()

    cases = [("inference b1", infer_ours, infer_hand), ("fwd+bwd b8", step_ours, step_hand)]
    for label, ours, base in cases:
        for side, fn in (("ours", ours), ("hand-written", base)):
            print(f"== {name} {label}, {side}")
            print(f"synced {call_times(fn, rounds, True)}, host {call_times(fn, rounds, False)}")
            print(kernel_profile(fn, 5, tops))
            if tops:
                print(python_profile(fn, 10, tops))
        sys.stdout.flush()


def profile_caffe_face(name: str, rounds: int, tops: int) -> None:
    """GPU mode's ``blobs['data'].data[...] = x; forward()`` against the torch face with the
    copies pycaffe's forward makes (the input to the device, the outputs back)."""
    net, x, _ = caffe_face(name, 1)
    torchcaffe.set_mode_gpu()
    torchcaffe.set_device(0)
    try:
        run_caffe, run_torch = face_calls(net, x, torch.device("cuda"))
        print(f"== {name} Caffe face b1: {call_times(run_caffe, rounds, True)}")
        print(f"== {name} torch face + copies b1: {call_times(run_torch, rounds, True)}")
        if tops:
            print(python_profile(run_caffe, 20, tops))
    finally:
        torchcaffe.set_mode_cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--tops", type=int, default=0, help="rows of each profile (0: none)")
    parser.add_argument(
        "--compiled", action="store_true", help="torch.compile'd inference b1 alone"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_gpu.py needs a CUDA device")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    with torchcaffe.caffe_float32(True):
        if args.compiled:
            for name in args.nets.split(","):
                profile_compiled(name, args.rounds, args.tops)
            return
        for name in args.nets.split(","):
            profile_net(name, args.rounds, args.tops)
        for name in args.nets.split(","):
            profile_caffe_face(name, args.rounds, args.tops)


if __name__ == "__main__":
    main()
