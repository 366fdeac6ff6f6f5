"""One inference pass on against off, on one of the issue-14 nets, interleaved in one process.

    python benchmarks/bench_pass_ab.py fuse_relu_into_producer [--net MobileNetV2]
        [--batch 1] [--repeat 41] [--threads 2]

Two copies of the net with the same random, calibrated weights: one runs every pass of
``INFERENCE_PASSES``, the other every pass but the one named. Their calls alternate (each
timed call after an untimed one of the same copy), and besides each side's median the script
prints the median of the per-round ratios (off / on): a round's two calls share the host's
state, so that median holds where the medians drift with a noisy host (results.md, "Readings
on a slower, noisier host"). It also checks the two outputs agree to 1e-4 first.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.handwritten import NETS  # noqa: E402
from benchmarks.run import prepare, timings  # noqa: E402
from torchcaffe.net import passes  # noqa: E402


def programs_without(pass_name: str) -> tuple[tuple, tuple]:
    """(every inference pass, every one but ``pass_name``)."""
    every = passes.INFERENCE_PASSES
    less = tuple(p for p in every if p.__name__ != pass_name)
    if len(less) == len(every):
        names = ", ".join(p.__name__ for p in every)
        raise SystemExit(f"no inference pass {pass_name!r}; the passes: {names}")
    return every, less


def build_with(net: torch.nn.Module, pass_list: tuple, x: torch.Tensor, out: str) -> torch.Tensor:
    """Run ``net`` once with ``pass_list`` as the pipeline, so its cached program is built
    from those passes; the pipeline is restored after."""
    every = passes.INFERENCE_PASSES
    passes.INFERENCE_PASSES = pass_list
    try:
        with torch.inference_mode():
            return net(data=x)[out]
    finally:
        passes.INFERENCE_PASSES = every


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pass_name", help="an inference pass, e.g. fuse_relu_into_producer")
    parser.add_argument("--net", default="MobileNetV2", choices=sorted(NETS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=41)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    every, less = programs_without(args.pass_name)
    net, _, out, size, _ = prepare(args.net)
    without = copy.deepcopy(net)
    x = torch.randn(args.batch, 3, size, size)
    gap = float((build_with(net, every, x, out) - build_with(without, less, x, out)).abs().max())
    if gap > 1e-4:
        raise SystemExit(f"the outputs differ by {gap:.2e} with and without {args.pass_name}")
    fired = net.optimized_program().report.get(args.pass_name)

    def run(m: torch.nn.Module) -> None:
        with torch.inference_mode():
            m(data=x)

    on, off = [], []
    for i in range(args.repeat):  # alternate which side goes first
        first, second = ((net, on), (without, off)) if i % 2 else ((without, off), (net, on))
        for m, times in (first, second):
            times += timings(lambda m=m: run(m), 1, warmup=1)
    ratios = sorted(b / a for a, b in zip(on, off))
    quarter = len(ratios) // 4
    print(
        f"{args.net} b{args.batch}, {args.pass_name} (fired {fired}): "
        f"on {1e3 * statistics.median(on):.2f} ms [{1e3 * min(on):.2f}-{1e3 * max(on):.2f}], "
        f"off {1e3 * statistics.median(off):.2f} ms [{1e3 * min(off):.2f}-{1e3 * max(off):.2f}]; "
        f"median of round ratios (off / on) {statistics.median(ratios):.3f} "
        f"(quartiles {ratios[quarter]:.3f}-{ratios[-quarter - 1]:.3f}); outputs within {gap:.1e}"
    )


if __name__ == "__main__":
    main()
