"""The ``-gpu`` flag of the caffe tool, turned into Caffe's process-wide mode and device."""

from __future__ import annotations

import torch

from .. import runtime
from ..errors import DeviceError
from .flags import gpu_ids


def requested_gpus(flag: str | None) -> list[int]:
    """The device ids ``-gpu`` names ([] = CPU); a clear DeviceError where CUDA is missing."""
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if flag is not None and flag.strip() == "all" and not available:
        raise DeviceError("-gpu all: CUDA is not available on this machine", hint="omit -gpu")
    ids = gpu_ids(flag, available)
    if ids and not available:
        raise DeviceError(
            f"-gpu {flag}: CUDA is not available on this machine",
            hint="omit -gpu (or pass -gpu -1) to run on the CPU",
        )
    for i in ids:
        if i >= available:
            raise DeviceError("no such CUDA device", expected=f"0..{available - 1}", got=i)
    return ids


def use_device(gpu: int | None) -> None:
    """Caffe::SetDevice + set_mode: the GPU ``gpu``, or the CPU for None."""
    if gpu is None:
        runtime.set_mode_cpu()
        return
    runtime.set_device(gpu)
    runtime.set_mode_gpu()
    torch.cuda.set_device(gpu)
