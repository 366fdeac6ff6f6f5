"""pycaffe's process-level bindings: glog-style logging, ``Timer`` and the NCCL names.

pycaffe's train.py logs with ``caffe.init_log``/``caffe.log`` and times forward/backward with
``caffe.Timer``; these map onto Python logging (the ``torchcaffe`` logger) and
``time.perf_counter``. torchcaffe trains one solver in one process, so it answers the NCCL
names as a Caffe built without NCCL does (``has_nccl()`` False), except that making an
``NCCL`` raises instead of silently doing nothing.
"""

from __future__ import annotations

import logging
import operator
import sys
import time
from typing import Any

import torch

from .. import runtime
from ..errors import UnsupportedError, UsageError
from ..glog import GlogFormatter

logger = logging.getLogger("torchcaffe")

# glog severities (FLAGS_minloglevel): 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL
_GLOG_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
_handler: logging.Handler | None = None


def init_log(level: int = 0, stderr: bool = True) -> None:
    """pycaffe's ``init_log([level[, stderr]])``: drop messages below glog ``level``
    (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL) on the ``torchcaffe`` logger, and show the rest on
    stderr in glog's format. torchcaffe writes no glog files: with ``stderr=False`` (glog: to
    files) only ERROR and above reach stderr. No handler is added when the root logger has
    one (the application's logging setup then shows the messages)."""
    global _handler
    try:
        severity = min(max(operator.index(level), 0), len(_GLOG_LEVELS) - 1)
    except TypeError:
        raise UsageError("caffe.init_log takes an int glog level", got=repr(level)) from None
    logger.setLevel(_GLOG_LEVELS[severity])
    if _handler is None and not logging.getLogger().handlers:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(GlogFormatter())
        logger.addHandler(_handler)
    if _handler is not None:
        _handler.setLevel(logging.NOTSET if stderr else logging.ERROR)


def log(message: str) -> None:
    """pycaffe's ``log(s)``: ``s`` at INFO (glog's LOG(INFO)) on the ``torchcaffe`` logger."""
    logger.info(message, stacklevel=2)


class Timer:
    """Caffe's Timer as pycaffe binds it: ``start()``, ``stop()`` and ``ms``, the milliseconds
    from the last start to its stop (read while running, it stops first; never started, it
    warns and gives 0). In GPU mode start and stop wait for the device's queued work, as
    Caffe's CUDA events measure it. Fractional, as Caffe's GPU timer (its CPU timer counts
    whole milliseconds)."""

    def __init__(self) -> None:
        self._running = False
        self._has_run = False
        self._start = 0.0
        self._stop = 0.0

    def start(self) -> None:
        if not self._running:
            _sync_device()
            self._start = time.perf_counter()
            self._running = True
            self._has_run = True

    def stop(self) -> None:
        if self._running:
            _sync_device()
            self._stop = time.perf_counter()
            self._running = False

    @property
    def ms(self) -> float:
        if not self._has_run:
            logger.warning("Timer has never been run before reading time.")
            return 0.0
        if self._running:
            self.stop()
        return (self._stop - self._start) * 1000.0


def _sync_device() -> None:
    if runtime.mode() == runtime.GPU and torch.cuda.is_available():
        torch.cuda.synchronize(runtime.compute_device())


def has_nccl() -> bool:
    """False: torchcaffe has no multi-GPU NCCL training (pycaffe's build flag USE_NCCL)."""
    return False


_NCCL_WHAT = "multi-GPU training over NCCL is not supported"
_NCCL_HINT = (
    "torchcaffe trains one solver in one process (caffe.has_nccl() is False); train on one "
    "device with caffe.set_device(id) and caffe.set_mode_gpu()"
)


class NCCL:
    """pycaffe's ``caffe.NCCL(solver, uid)`` for multi-GPU training: not supported."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise UnsupportedError(f"caffe.NCCL: {_NCCL_WHAT}", hint=_NCCL_HINT)

    @staticmethod
    def new_uid() -> bytes:
        raise UnsupportedError(f"caffe.NCCL.new_uid: {_NCCL_WHAT}", hint=_NCCL_HINT)
