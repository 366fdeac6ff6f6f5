"""Net build time against net size: a chain of layers and one Concat over many bottoms.

    python benchmarks/bench_build_scaling.py [--sizes 2500 5000 10000 20000] [--repeat 3]
    python benchmarks/bench_build_scaling.py --resnet [--repeat 10]

``--resnet`` times issue 14's build targets instead, with one torch thread: ResNet-50 and
ResNet-152 deploy builds (no weights), and ResNet-152 ``load(proto, weights)`` against a raw
read of its caffemodel, interleaved in one process. Wall and CPU (process) seconds are both
printed, median [min-max]: on a shared machine wall time also counts waiting for a core.

Build time should grow linearly. Baseline, in one run: the smallest size of each shape; the
ratio column is (time / baseline time) / (size / baseline size), so about 1.0 means linear and
a growing ratio means super-linear (issue 13: Concat over 20k bottoms used to take ~4 s, from a
list used as the builder's set of available blobs). Medians of ``--repeat`` runs, with ranges.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
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


def resnet_targets(repeat: int) -> None:
    """Issue 14's build and load rows, wall and CPU time, interleaved after one warm-up."""
    import torch

    from benchmarks.resnet_proto import resnet_prototxt
    from benchmarks.run import random_weights_

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        protos = {}
        for depth in (50, 152):
            protos[depth] = Path(tmp) / f"resnet{depth}.prototxt"
            protos[depth].write_text(resnet_prototxt(depth))
        weights = Path(tmp) / "resnet152.caffemodel"
        net = torchcaffe.load(protos[152])
        random_weights_(net)
        torchcaffe.save_weights(net, weights)
        del net

        def raw() -> None:
            with open(weights, "rb") as f:
                f.read()

        rows: dict[str, Callable[[], object]] = {
            "ResNet-50 build, no weights": lambda: torchcaffe.load(protos[50]),
            "ResNet-152 build, no weights": lambda: torchcaffe.load(protos[152]),
            f"ResNet-152 load(proto, {weights.stat().st_size / 2**20:.0f} MiB weights)": (
                lambda: torchcaffe.load(protos[152], weights)
            ),
            "raw read of that caffemodel": raw,
        }
        times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in rows}
        for i in range(repeat + 1):
            for what, fn in rows.items():
                wall, cpu = time.perf_counter(), time.process_time()
                fn()
                if i:  # the first round warms up
                    times[what][0].append(time.perf_counter() - wall)
                    times[what][1].append(time.process_time() - cpu)
    print(f"{'':44} {'wall s, median [range]':>24} {'cpu s, median [range]':>24}")
    for what, (wall, cpu) in times.items():
        print(f"{what:44} {_spread(wall):>24} {_spread(cpu):>24}")
    load, raw_read = list(times.values())[2:]
    for i, unit in enumerate(("wall", "cpu")):
        ratio = statistics.median(load[i]) / statistics.median(raw_read[i])
        print(f"load(proto, weights) / raw read ({unit}): {ratio:.2f} (target <= 2)")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2500, 5000, 10000, 20000])
    ap.add_argument("--repeat", type=int, default=None, help="3 (sizes) or 10 (--resnet)")
    ap.add_argument("--resnet", action="store_true", help="issue 14's ResNet build targets")
    args = ap.parse_args()
    if args.resnet:
        resnet_targets(args.repeat or 10)
        return
    args.repeat = args.repeat or 3
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
