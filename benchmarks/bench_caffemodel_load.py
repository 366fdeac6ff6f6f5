"""Load a large VGG16-shaped caffemodel: time vs a raw read, peak memory vs the weights' size.

    python benchmarks/bench_caffemodel_load.py [--scale 1.0] [--keep PATH]

Baselines, in one run:
  * raw read:   reading the same file into one bytes object (the floor for any loader);
  * protobuf:   ``NetParameter.ParseFromString`` of the whole file + numpy copies per blob
                (what a naive loader does; refused by protobuf past 2 GB).
Each loader runs in a fresh subprocess so its peak RSS is its own. Peak memory is reported as
(peak RSS during the load - RSS before it) / weights size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def vgg16_prototxt(scale: float) -> str:
    """VGG16 deploy net; ``scale`` < 1 shrinks fc widths for a quick smoke run."""
    fc = max(16, int(4096 * scale))
    lines = [
        'name: "VGG16"',
        'layer { name: "data" type: "Input" top: "data" '
        "input_param { shape { dim: 1 dim: 3 dim: 224 dim: 224 } } }",
    ]
    bottom, blocks = "data", [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]
    for b, (width, n) in enumerate(blocks, 1):
        for i in range(1, n + 1):
            name = f"conv{b}_{i}"
            lines.append(
                f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" '
                f'top: "{name}" convolution_param {{ num_output: {width} pad: 1 '
                f"kernel_size: 3 }} }}"
            )
            lines.append(
                f'layer {{ name: "relu{b}_{i}" type: "ReLU" bottom: "{name}" top: "{name}" }}'
            )
            bottom = name
        lines.append(
            f'layer {{ name: "pool{b}" type: "Pooling" bottom: "{bottom}" '
            f'top: "pool{b}" pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}'
        )
        bottom = f"pool{b}"
    for name, width in (("fc6", fc), ("fc7", fc), ("fc8", 1000)):
        lines.append(
            f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" '
            f'top: "{name}" inner_product_param {{ num_output: {width} }} }}'
        )
        bottom = name
    return "\n".join(lines) + "\n"


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def reset_peak() -> None:
    try:  # Linux >= 4.0: writing 5 to clear_refs resets VmHWM
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def child(mode: str, prototxt: str, model: str) -> None:
    import numpy as np

    import torchcaffe
    from torchcaffe.proto import caffe_pb2

    net = torchcaffe.load(prototxt) if mode != "raw" else None
    if net is not None:  # zero params are lazily mapped pages: make the net's own memory
        with __import__("torch").no_grad():  # resident first, so only the loader's counts
            for p in net.parameters():
                p.fill_(0.0)
    reset_peak()
    before = rss_mb()
    t0 = time.perf_counter()
    if mode == "raw":
        with open(model, "rb") as f:
            data = f.read()
        assert len(data) == os.path.getsize(model)
    elif mode == "torchcaffe":
        torchcaffe.load_weights(net, model)
    elif mode == "protobuf":
        msg = caffe_pb2.NetParameter()
        with open(model, "rb") as f:
            msg.ParseFromString(f.read())
        for layer in msg.layer:
            for j, blob in enumerate(layer.blobs):
                target = net.layer(layer.name).param_blobs()[j]
                target.data.copy_(
                    __import__("torch").from_numpy(
                        np.asarray(blob.data, dtype=np.float32).reshape(target.shape)
                    )
                )
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "peak_extra_mb": peak_mb() - before}))


def run_child(mode: str, prototxt: str, model: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, prototxt, model],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fc width scale (1.0 = VGG16)")
    parser.add_argument("--keep", type=Path, help="write the caffemodel here and keep it")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    import torchcaffe

    with tempfile.TemporaryDirectory() as tmp:
        prototxt = os.path.join(tmp, "vgg16.prototxt")
        Path(prototxt).write_text(vgg16_prototxt(args.scale))
        model = str(args.keep or os.path.join(tmp, "vgg16.caffemodel"))
        net = torchcaffe.load(prototxt)
        torchcaffe.save_weights(net, model)
        weights_mb = sum(p.numel() * 4 for p in net.parameters()) / 2**20
        del net
        size_mb = os.path.getsize(model) / 2**20
        print(
            f"VGG16-shaped caffemodel: {size_mb:.0f} MiB on disk, "
            f"{weights_mb:.0f} MiB of float32 weights"
        )
        results = {m: run_child(m, prototxt, model) for m in ("raw", "torchcaffe", "protobuf")}
        raw = results["raw"]["seconds"]
        print(
            f"{'loader':12s} {'seconds':>8s} {'x raw read':>10s} {'peak extra MiB':>15s} "
            f"{'x weights':>10s}"
        )
        for mode, r in results.items():
            print(
                f"{mode:12s} {r['seconds']:8.3f} {r['seconds'] / raw:10.2f} "
                f"{r['peak_extra_mb']:15.0f} {r['peak_extra_mb'] / weights_mb:10.2f}"
            )


if __name__ == "__main__":
    main()
