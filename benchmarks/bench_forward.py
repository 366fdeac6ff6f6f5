"""Compiled CaffeNet vs the same net written by hand in torch: forward and training-step time.

    python benchmarks/bench_forward.py [--batch 16] [--repeat 10] [--device cpu|cuda]

Baseline, in one run: ``HandWrittenCaffeNet`` below, an ``nn.Sequential`` of torch's own
modules holding the very same weights (checked to give the same outputs first). The ratio is
compiled time / hand-written time, so 1.00x means the compiler adds nothing; the Net's own
cost is the blob dictionary and one Python call per Caffe layer. On CUDA the peak memory of
a training step is reported the same way.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torchcaffe  # noqa: E402
from torchcaffe.formats.prototxt import parse_net_text  # noqa: E402

CONVS = [  # name, num_output, kernel, stride, pad, group, followed by pool+norm
    ("conv1", 96, 11, 4, 0, 1, True),
    ("conv2", 256, 5, 1, 2, 2, True),
    ("conv3", 384, 3, 1, 1, 1, False),
    ("conv4", 384, 3, 1, 1, 2, False),
    ("conv5", 256, 3, 1, 1, 2, False),
]


def caffenet_prototxt(batch: int) -> str:
    """BVLC reference CaffeNet deploy net (pool before LRN), TRAIN-able with a softmax loss."""
    lines = [
        'name: "CaffeNet"',
        'layer { name: "data" type: "Input" top: "data" top: "label" input_param { '
        f"shape {{ dim: {batch} dim: 3 dim: 227 dim: 227 }} shape {{ dim: {batch} }} }} }}",
    ]
    bottom = "data"
    for name, n, k, s, p, g, pool_norm in CONVS:
        i = name[-1]
        lines.append(
            f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
            f"convolution_param {{ num_output: {n} kernel_size: {k} stride: {s} pad: {p} "
            f'group: {g} weight_filler {{ type: "gaussian" std: 0.01 }} }} }}'
        )
        lines.append(f'layer {{ name: "relu{i}" type: "ReLU" bottom: "{name}" top: "{name}" }}')
        bottom = name
        if pool_norm or name == "conv5":
            lines.append(
                f'layer {{ name: "pool{i}" type: "Pooling" bottom: "{bottom}" '
                f'top: "pool{i}" pooling_param {{ pool: MAX kernel_size: 3 '
                "stride: 2 } }"
            )
            bottom = f"pool{i}"
        if pool_norm:
            lines.append(
                f'layer {{ name: "norm{i}" type: "LRN" bottom: "{bottom}" '
                f'top: "norm{i}" lrn_param {{ local_size: 5 alpha: 0.0001 '
                "beta: 0.75 } }"
            )
            bottom = f"norm{i}"
    for name, n in (("fc6", 4096), ("fc7", 4096), ("fc8", 1000)):
        lines.append(
            f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" '
            f'top: "{name}" inner_product_param {{ num_output: {n} '
            f'weight_filler {{ type: "gaussian" std: 0.005 }} }} }}'
        )
        bottom = name
        if name != "fc8":
            i = name[-1]
            lines.append(f'layer {{ name: "relu{i}" type: "ReLU" bottom: "{name}" top: "{name}" }}')
            lines.append(
                f'layer {{ name: "drop{i}" type: "Dropout" bottom: "{name}" '
                f'top: "{name}" dropout_param {{ dropout_ratio: 0.5 }} }}'
            )
    lines.append(
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc8" bottom: "label" top: "loss" }'
    )
    return "\n".join(lines)


class HandWrittenCaffeNet(nn.Module):
    """CaffeNet as one would write it in torch, with weights copied from the compiled net."""

    def __init__(self, net: torchcaffe.TorchNet) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for name, n, k, s, p, g, pool_norm in CONVS:
            conv = nn.Conv2d(channels, n, k, s, p, groups=g)
            self._copy(conv, net, name)
            layers += [conv, nn.ReLU(inplace=True)]
            if pool_norm or name == "conv5":
                layers.append(nn.MaxPool2d(3, 2, ceil_mode=True))
            if pool_norm:
                layers.append(nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0))
            channels = n
        layers.append(nn.Flatten())
        features = 256 * 6 * 6
        for name, n in (("fc6", 4096), ("fc7", 4096), ("fc8", 1000)):
            fc = nn.Linear(features, n)
            self._copy(fc, net, name)
            layers.append(fc)
            if name != "fc8":
                layers += [nn.ReLU(inplace=True), nn.Dropout(0.5)]
            features = n
        self.body = nn.Sequential(*layers)

    @staticmethod
    def _copy(module: nn.Module, net: torchcaffe.TorchNet, name: str) -> None:
        weight, bias = net.layer(name).param_blobs()
        with torch.no_grad():
            module.weight.copy_(weight)
            module.bias.copy_(bias)

    def forward(self, data: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.body(data), label.long())


def timed(fn, repeat: int, device: str) -> float:
    """Median seconds of ``repeat`` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def peak_cuda_bytes(fn) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    torchcaffe.set_random_seed(0)

    compiled = torchcaffe.load(parse_net_text(caffenet_prototxt(args.batch)), phase="train")
    handwritten = HandWrittenCaffeNet(compiled)
    compiled.to(args.device)
    handwritten.to(args.device)
    data = torch.randn(args.batch, 3, 227, 227, device=args.device)
    label = torch.randint(0, 1000, (args.batch,), device=args.device).float()

    compiled.eval()
    handwritten.eval()
    with torch.no_grad():
        gap = (compiled(data=data, label=label)["loss"] - handwritten(data, label)).abs().item()
    print(
        f"CaffeNet batch {args.batch} on {args.device}, torch {torch.__version__}; "
        f"|loss(compiled) - loss(hand-written)| = {gap:.2e} (eval mode)"
    )

    def infer(model, call):
        def run():
            with torch.no_grad():
                call(model)

        return run

    def train_step(model, call):
        def run():
            model.zero_grad(set_to_none=True)
            loss = call(model)
            loss.backward()

        return run

    calls = {
        "compiled": lambda m: m(data=data, label=label)["loss"],
        "hand-written": lambda m: m(data, label),
    }
    models = {"compiled": compiled, "hand-written": handwritten}
    rows = []
    for what, make in (("forward (eval)", infer), ("forward+backward (train)", train_step)):
        times = {}
        for key, model in models.items():
            model.train(what.endswith("(train)"))
            times[key] = timed(make(model, calls[key]), args.repeat, args.device)
        rows.append((what, times))
    print(f"{'':26s}{'hand-written (baseline)':>26s}{'torchcaffe':>14s}{'ratio':>9s}")
    for what, t in rows:
        print(
            f"{what:26s}{t['hand-written'] * 1e3:23.1f} ms{t['compiled'] * 1e3:11.1f} ms"
            f"{t['compiled'] / t['hand-written']:8.2f}x"
        )
    if args.device == "cuda":
        peaks = {k: peak_cuda_bytes(train_step(m, calls[k])) for k, m in models.items()}
        print(
            f"{'peak memory, train step':26s}{peaks['hand-written'] / 2**20:20.1f} MiB"
            f"{peaks['compiled'] / 2**20:9.1f} MiB"
            f"{peaks['compiled'] / peaks['hand-written']:8.2f}x"
        )


if __name__ == "__main__":
    main()
