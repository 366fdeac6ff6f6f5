"""Inference passes and the Caffe face: eager forward times, interleaved in one process.

    python benchmarks/bench_passes.py [--repeat 7] [--profile]

1. ResNet-50 (../shared/models/resnet50_kaiminghe) at batch 1 under ``inference_mode``:
   ``net.optimize = False`` (Caffe's literal layer program) vs True (net/passes applied).
2. The Caffe face (``net.blobs['data'].data[...] = x; net.forward()``) vs the torch face
   (``net(data=x)`` under ``inference_mode``) on MobileNetV2 and GoogLeNet.
Weights are random, written through our own save_weights and loaded back. Medians and
(min-max) of interleaved rounds; the machine is shared, so read ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torchcaffe  # noqa: E402
import torchcaffe as caffe  # noqa: E402

MODELS = (REPO / ".." / "shared" / "models").resolve()  # the shared folder beside the checkout
NETS = {
    "resnet50": MODELS / "resnet50_kaiminghe" / "ResNet-50-deploy.prototxt",
    "mobilenet_v2": MODELS / "mobilenet_v2" / "mobilenet_v2_deploy.prototxt",
    "googlenet": MODELS / "bvlc_googlenet" / "deploy.prototxt",
}


def random_weights(proto: Path, out: Path) -> Path:
    """A caffemodel of random, well-scaled weights (BN variances positive)."""
    net = torchcaffe.load(proto)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in net.layers.values():
            for t in module.param_blobs():
                if t.dim() == 1:
                    t.copy_(torch.rand(t.shape, generator=gen) * 0.2 + 0.9)
                else:
                    fan_in = max(1, t[0].numel())
                    t.copy_(torch.randn(t.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
    path = out / f"{proto.stem}.caffemodel"
    torchcaffe.save_weights(net, path)
    return path


def timed(fn, repeat: int) -> list[float]:
    fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def summary(ms: list[float]) -> str:
    return f"{statistics.median(ms):8.1f} ms ({min(ms):.1f}-{max(ms):.1f})"


def bench_passes(proto: Path, weights: Path, repeat: int, profile: bool) -> None:
    net = torchcaffe.load(proto, weights).eval()
    x = torch.randn(1, *net.blob_shapes["data"][1:])
    print(f"{proto.parent.name}: {net.optimized_program().report}")
    off, on = [], []

    def run(optimize: bool) -> None:
        net.optimize = optimize
        with torch.inference_mode():
            net(data=x)

    for _ in range(repeat):  # interleaved so drift hits both alike
        off += timed(lambda: run(False), 1)
        on += timed(lambda: run(True), 1)
    print(f"  passes off {summary(off)}\n  passes on  {summary(on)}")
    print(
        f"  speedup (median off / median on): {statistics.median(off) / statistics.median(on):.2f}x"
    )
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as prof

        with prof(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(3):
                run(True)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def bench_faces(proto: Path, weights: Path, repeat: int) -> None:
    torch_net = torchcaffe.load(proto, weights).eval()
    caffe_net = caffe.Net(str(proto), caffe.TEST, weights=str(weights))
    shape = caffe_net.blobs["data"].data.shape
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    xt = torch.from_numpy(x)

    def torch_face() -> None:
        with torch.inference_mode():
            torch_net(data=xt)

    def caffe_face() -> None:
        caffe_net.blobs["data"].data[...] = x
        caffe_net.forward()

    tf, cf = [], []
    for _ in range(repeat):
        tf += timed(torch_face, 1)
        cf += timed(caffe_face, 1)
    print(f"{proto.parent.name} batch {shape[0]}:")
    print(f"  torch face {summary(tf)}\n  caffe face {summary(cf)}")
    print(f"  caffe / torch (medians): {statistics.median(cf) / statistics.median(tf):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--only", choices=["passes", "faces"], default=None)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "passes"):
            w = random_weights(NETS["resnet50"], Path(tmp))
            bench_passes(NETS["resnet50"], w, args.repeat, args.profile)
        if args.only in (None, "faces"):
            for name in ("mobilenet_v2", "googlenet"):
                w = random_weights(NETS[name], Path(tmp))
                bench_faces(NETS[name], w, args.repeat)


if __name__ == "__main__":
    main()
