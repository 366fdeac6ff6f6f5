"""Net build time against net size: a chain of layers and one Concat over many bottoms.

    python benchmarks/bench_build_scaling.py [--sizes 2500 5000 10000 20000] [--repeat 3]

Build time should grow linearly. Baseline, in one run: the smallest size of each shape; the
ratio column is (time / baseline time) / (size / baseline size), so about 1.0 means linear and
a growing ratio means super-linear (issue 13: Concat over 20k bottoms used to take ~4 s, from a
list used as the builder's set of available blobs). Medians of ``--repeat`` runs, with ranges.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torchcaffe  # noqa: E402
from torchcaffe.proto import caffe_pb2  # noqa: E402


def concat_net(n: int) -> caffe_pb2.NetParameter:
    net = caffe_pb2.NetParameter(name=f"concat{n}")
    data = net.layer.add(name="data", type="Input")
    data.top.extend(f"d{i}" for i in range(n))
    data.input_param.shape.add().dim.extend([1, 2])
    cat = net.layer.add(name="cat", type="Concat", top=["out"])
    cat.bottom.extend(f"d{i}" for i in range(n))
    return net


def chain_net(n: int) -> caffe_pb2.NetParameter:
    net = caffe_pb2.NetParameter(name=f"chain{n}")
    data = net.layer.add(name="data", type="Input", top=["b0"])
    data.input_param.shape.add().dim.extend([1, 2])
    for i in range(n):
        net.layer.add(name=f"r{i}", type="ReLU", bottom=[f"b{i}"], top=[f"b{i + 1}"])
    return net


def timed(net: caffe_pb2.NetParameter, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        torchcaffe.load(net)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2500, 5000, 10000, 20000])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for label, make in (("concat bottoms", concat_net), ("chain layers", chain_net)):
        base = None
        print(f"{label:>15} {'size':>7} {'median s':>9} {'range s':>15} {'ratio':>6}")
        for n in args.sizes:
            times = timed(make(n), args.repeat)
            med = statistics.median(times)
            base = base or (n, med)
            ratio = (med / base[1]) / (n / base[0])
            print(
                f"{'':>15} {n:>7} {med:>9.3f} {min(times):>7.3f}-{max(times):<7.3f} {ratio:>6.2f}"
            )


if __name__ == "__main__":
    main()
