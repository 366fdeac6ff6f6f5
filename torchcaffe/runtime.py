"""Process-wide Caffe mode (CPU/GPU), device id and RNG seed, as Caffe's singleton holds them."""

from __future__ import annotations

import operator
import os
import random
import threading

import numpy as np
import torch

from .errors import DeviceError, UsageError

CPU = "cpu"
GPU = "gpu"

_state = threading.local()


def _get(name: str, default):
    return getattr(_state, name, default)


def mode() -> str:
    return _get("mode", CPU)


def device_id() -> int:
    return _get("device_id", 0)


def set_mode_cpu() -> None:
    _state.mode = CPU


def set_mode_gpu() -> None:
    if not torch.cuda.is_available():
        raise DeviceError(
            "caffe.set_mode_gpu(): CUDA is not available on this machine",
            hint="use caffe.set_mode_cpu(), or install a CUDA build of torch",
        )
    _state.mode = GPU


def set_device(device: int) -> None:
    if torch.cuda.is_available() and not 0 <= device < torch.cuda.device_count():
        raise DeviceError(
            "no such CUDA device", expected=f"0..{torch.cuda.device_count() - 1}", got=device
        )
    _state.device_id = int(device)


def compute_device() -> torch.device:
    """The torch device the current Caffe mode computes on."""
    if mode() == GPU:
        return torch.device("cuda", device_id())
    return torch.device("cpu")


# Caffe's multi-GPU bookkeeping (Caffe::solver_count & co., per thread like the mode): pycaffe
# scripts set and read it; torchcaffe trains one solver in one process, so it is only recorded
# (solver/distributed.attach sets it for each rank of a multi-process run).


def _whole(name: str, value: int) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise UsageError(f"caffe.{name} takes an int", got=repr(value)) from None


def solver_count() -> int:
    return _get("solver_count", 1)


def set_solver_count(count: int) -> None:
    _state.solver_count = _whole("set_solver_count", count)


def solver_rank() -> int:
    return _get("solver_rank", 0)


def set_solver_rank(rank: int) -> None:
    _state.solver_rank = _whole("set_solver_rank", rank)


def multiprocess() -> bool:
    return _get("multiprocess", False)


def set_multiprocess(value: bool) -> None:
    _state.multiprocess = bool(value)


def set_random_seed(seed: int) -> None:
    """Seed every RNG torchcaffe draws from (fillers, dropout, shuffling)."""
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))
    random.seed(seed)


# Label-range checks read every label on the host (a device sync per loss layer), so they are
# opt-in: debug a data set with ``set_label_range_checks(True)`` or ``TORCHCAFFE_CHECK_LABELS=1``.
_check_labels = os.environ.get("TORCHCAFFE_CHECK_LABELS", "") not in ("", "0")


def set_label_range_checks(enabled: bool) -> None:
    """Turn on (or off) the label-range checks of the loss and accuracy layers, and the
    index-range checks of Embed, BatchReindex and the unpooling masks (MaxUnPool, SegNet's
    Upsample) off the CPU (all threads), where reading their result syncs with the device.
    On the CPU all of them always run, but in a trace (torch.compile, torch.export) none
    does."""
    global _check_labels
    _check_labels = bool(enabled)


def label_range_checks() -> bool:
    return _check_labels
