"""The Caffe face's forward vs the torch face's, on the four issue-14 nets (issue 14: <= 1.1x).

    python benchmarks/bench_caffe_face.py [--nets CaffeNet,...] [--batches 1,8] [--repeat 15]

Caffe face: ``net.blobs['data'].data[...] = x; net.forward()`` on ``torchcaffe.pycaffe.Net``.
Torch face: ``net.module(data=x)`` under ``torch.inference_mode()`` on the very same compiled
net (same weights); on a GPU with the copies the Caffe face must make (``measure``). Both
are timed alternately in one process with one torch thread; the ratio is Caffe face / torch
face (1.00x: the Caffe face adds nothing).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torchcaffe  # noqa: E402
from benchmarks.handwritten import NETS  # noqa: E402
from benchmarks.run import (  # noqa: E402
    MODELS,
    calibrate_batchnorm_,
    calibration_batch,
    interleaved,
    random_weights_,
    synced,
)
from torchcaffe.pycaffe import Net  # noqa: E402


def caffe_face(name: str, batch: int) -> tuple[Net, torch.Tensor, str]:
    """A Caffe-face net with random, calibrated weights, shaped for ``batch``."""
    rel, _, out, size = NETS[name]
    net = Net(str(MODELS / rel), phase="test")
    random_weights_(net.module)
    calibrate_batchnorm_(net.module, calibration_batch(size))
    net.blobs["data"].reshape(batch, 3, size, size)
    net.reshape()
    return net, torch.randn(batch, 3, size, size), out


def face_calls(
    net: Net, x: torch.Tensor, device: torch.device
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(the Caffe face's ``blobs['data'].data[...] = x; forward()``, the torch face's call
    it is measured against). On a CUDA ``device`` the Caffe face runs in GPU mode (the caller
    sets it; its forward returns host arrays, as pycaffe's does), so the torch face's call
    makes the copies that needs too (issue 14: "the torch face plus the copies its numpy
    views need"): the numpy input to the device, the outputs back to the host."""
    torch_net = net.module
    array = x.numpy()

    def run_caffe() -> None:
        net.blobs["data"].data[...] = array
        net.forward()

    def run_torch() -> None:
        with torch.inference_mode():
            if device.type == "cpu":
                torch_net(data=x)
                return
            outputs = torch_net(data=torch.from_numpy(array).to(device))
            for top in outputs.values():
                top.cpu()

    return run_caffe, run_torch


def measure(
    name: str, batch: int, repeat: int, device: torch.device | str = "cpu"
) -> tuple[list[float], list[float]]:
    """Caffe-face and torch-face seconds per forward (``face_calls``), alternated."""
    device = torch.device(device)
    net, x, out = caffe_face(name, batch)
    if device.type == "cuda":
        torchcaffe.set_mode_gpu()
        torchcaffe.set_device(device.index or 0)
    try:
        run_caffe, run_torch = face_calls(net, x, device)
        run_caffe()  # in GPU mode, this moves the module to the device
        with torch.inference_mode():
            want = net.module(data=x.to(device))[out].cpu()
        gap = float((torch.from_numpy(net.blobs[out].data) - want).abs().max())
        if gap > 1e-5:
            raise SystemExit(f"{name}: Caffe face and torch face disagree ({gap:.2e})")
        return interleaved(run_caffe, synced(run_torch, device), repeat)
    finally:
        torchcaffe.set_mode_cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"threads={args.threads} repeat={args.repeat} torch {torch.__version__}")
    print(f"{'net':12s}{'batch':>6s}{'caffe face ms':>22s}{'torch face ms':>22s}{'ratio':>22s}")
    for name in args.nets.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            tc, tt = measure(name, batch, args.repeat)
            ratios = [c / t for c, t in zip(tc, tt)]
            print(
                f"{name:12s}{batch:6d}{_fmt(tc, 1e3):>22s}{_fmt(tt, 1e3):>22s}"
                f"{_fmt(ratios, 1, '.3f'):>22s}",
                flush=True,
            )


def _fmt(values: list[float], scale: float, spec: str = ".1f") -> str:
    """median [min-max]"""
    v = [x * scale for x in values]
    return f"{statistics.median(v):{spec}} [{min(v):{spec}}-{max(v):{spec}}]"


if __name__ == "__main__":
    main()
