"""Forward a net on seeded random inputs and report every output (shape, mean, abs-max).

torchcaffe run NET.prototxt [--weights W.caffemodel] [--input data=1,3,224,224]
               [--phase test] [--seed 0] [--save OUT.caffemodel] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from ..api import load, save_weights
from ..errors import DeviceError, LayerParamError
from .flags import add_python_layers_flag


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prototxt")
    p.add_argument("--weights", help="caffemodel (binary or HDF5) to load")
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="BLOB=D0,D1,...",
        help="input (or data-layer top) shape; repeatable",
    )
    p.add_argument("--phase", default="test", choices=["train", "test"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--save", help="write the (loaded) weights back as a caffemodel")
    add_python_layers_flag(p)


def parse_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in items:
        name, _, dims = item.partition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise LayerParamError(
                f"bad --input {item!r}", expected="BLOB=D0,D1,...", got=item
            ) from None
    return shapes


def torch_device(name: str) -> torch.device:
    """``--device`` as a torch device this machine has, else a DeviceError."""
    try:
        device = torch.device(name)
        torch.empty(0, device=device)  # CUDA or another backend missing from this build
    except (RuntimeError, AssertionError) as err:
        raise DeviceError(
            f"--device {name}: not a device of this machine ({str(err).splitlines()[0]})",
            hint="--device cpu",
        ) from None
    return device


def main(args: argparse.Namespace) -> int:
    device = torch_device(args.device)
    shapes = parse_shapes(args.input)
    net = load(
        args.prototxt,
        args.weights,
        args.phase,
        input_shapes=shapes or None,
        allow_python_layers=args.allow_python_layers,
    ).to(device)
    gen = torch.Generator().manual_seed(args.seed)
    inputs = {
        name: torch.rand(net.blob_shapes[name], generator=gen).to(device)
        for name in net.input_names
    }
    start = time.perf_counter()
    with torch.no_grad():
        blobs = net.forward_all_blobs(**inputs)
    elapsed = time.perf_counter() - start
    n_params = sum(p.numel() for p in net.parameters())
    print(
        f"net '{net.name}': {len(net.steps)} layers, {n_params:,} learnable values, "
        f"forward {elapsed * 1e3:.1f} ms on {args.device}"
    )
    names = net.output_names + [n for n in net.loss_weights() if n not in net.output_names]
    for name in names:
        t = blobs[name].float()
        print(
            f"  {name:24s} {tuple(t.shape)!s:20s} mean {t.mean().item():+.6g}  "
            f"absmax {t.abs().max().item():.6g}"
        )
    if args.save:
        save_weights(net, args.save)
        print(f"weights written to {args.save}")
    return 0
