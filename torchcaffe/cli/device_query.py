"""Show diagnostic information for GPU devices, as ``caffe device_query``.

    torchcaffe device_query -gpu 0|0,1|all

As Caffe's: the devices ``-gpu`` names, logged to stderr in glog's format (the fields torch
reports of Caffe's list); without ``-gpu`` none is queried and it succeeds, with CUDA or not.
A ``-gpu`` on a machine without CUDA is an error.
"""

from __future__ import annotations

import argparse
import logging

import torch

from ..glog import on_stderr
from .devices import requested_gpus

log = logging.getLogger("torchcaffe.caffe")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", default="", help="device ids, comma-separated, or 'all'")


def main(args: argparse.Namespace) -> int:
    with on_stderr(log):
        log.info("Querying GPUs %s", args.gpu)
        for gpu in requested_gpus(args.gpu):
            prop = torch.cuda.get_device_properties(gpu)
            fields = [
                ("Device id", gpu),
                ("Major revision number", prop.major),
                ("Minor revision number", prop.minor),
                ("Name", prop.name),
                ("Total global memory", prop.total_memory),
                ("Total shared memory per block", getattr(prop, "shared_memory_per_block", None)),
                ("Warp size", getattr(prop, "warp_size", None)),
                ("Number of multiprocessors", prop.multi_processor_count),
            ]
            for name, value in fields:
                if value is not None:
                    log.info("%-31s%s", f"{name}:", value)
    return 0
