"""Show diagnostic information for GPU devices, as ``caffe device_query``.

    torchcaffe device_query [-gpu 0|0,1|all]

Without ``-gpu`` every visible device is listed (Caffe lists none); without CUDA it says so
and exits non-zero.
"""

from __future__ import annotations

import argparse

import torch

from ..errors import DeviceError
from .devices import requested_gpus


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", default="all", help="device ids, comma-separated, or 'all'")


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise DeviceError(
            "no CUDA device: torch reports CUDA unavailable",
            hint=f"torch {torch.__version__} (CUDA build: {torch.version.cuda or 'no'})",
        )
    print(f"Querying GPUs {args.gpu}")
    for gpu in requested_gpus(args.gpu):
        prop = torch.cuda.get_device_properties(gpu)
        free, total = torch.cuda.mem_get_info(gpu)
        print(f"Device id:                     {gpu}")
        print(f"Major revision number:         {prop.major}")
        print(f"Minor revision number:         {prop.minor}")
        print(f"Name:                          {prop.name}")
        print(f"Total global memory:           {total}")
        print(f"Free global memory:            {free}")
        print(f"Number of multiprocessors:     {prop.multi_processor_count}")
        print(f"Warp size:                     {getattr(prop, 'warp_size', 32)}")
    return 0
