"""Caffe's float32 on CUDA: IEEE products in cuDNN convolutions and cuBLAS matmuls.

torch lets cuDNN run float32 convolutions in TF32 on Ampere and later GPUs by default (and
matmuls too after ``torch.set_float32_matmul_precision("high")``): inputs rounded to 10
mantissa bits, about 1e-3 relative error (an H200's profile showed the TF32 kernels). Caffe's
float32 is IEEE. The nets' own entry points (the torch face's eager forward and the backward
that reaches its outputs, the Caffe face's forward, backward and solver steps) run under
``caffe_float32``; it restores the caller's settings when they end, so other models keep
theirs. A ``torch.compile``d net runs under whatever is set when it is called: wrap those
calls in ``torchcaffe.caffe_float32()`` for Caffe's numbers.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

import torch
from torch.autograd import Variable


def _settings() -> list[tuple[object, str, object]]:
    """(owner, attribute, IEEE value) for each TF32 switch this torch has. torch 2.9 added
    per-backend ``fp32_precision``; mixing it with the legacy ``allow_tf32`` flags makes torch
    raise, so only one family is touched."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    matmul = torch.backends.cuda.matmul
    if conv is not None and hasattr(conv, "fp32_precision") and hasattr(matmul, "fp32_precision"):
        return [(conv, "fp32_precision", "ieee"), (matmul, "fp32_precision", "ieee")]
    return [(torch.backends.cudnn, "allow_tf32", False), (matmul, "allow_tf32", False)]


_lock = threading.Lock()
_depth = 0  # callers inside caffe_float32, all threads together
_saved: list[object] = []  # the settings the first of them found


def _enter() -> None:
    """(The switches are looked up only by the first caller: a net's every forward enters.)"""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            settings = _settings()
            _saved = [getattr(owner, name) for owner, name, _ in settings]
            for owner, name, ieee in settings:
                setattr(owner, name, ieee)
        _depth += 1


def _leave() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0:
            for (owner, name, _), value in zip(_settings(), _saved):
                setattr(owner, name, value)


@contextlib.contextmanager
def caffe_float32(enabled: bool = True) -> Iterator[None]:
    """Within: float32 convolutions and matmuls on CUDA in IEEE arithmetic, as Caffe's;
    when the last caller (of any thread) leaves, the settings the first found come back, so
    that two threads' nets cannot restore each other's values. ``enabled=False`` changes
    nothing."""
    if not enabled:
        yield
        return
    _enter()
    try:
        yield
    finally:
        _leave()


def caffe_float32_backward(outputs: Iterable[torch.Tensor]) -> None:
    """Make the backward pass that reaches ``outputs`` (a torch-face ``loss.backward()``) run
    in IEEE float32 too: the first of their gradient hooks to fire enters ``caffe_float32``
    and the autograd engine's end-of-pass callback leaves it. A backward that raises ends
    without that callback and leaves IEEE set: slower for other models, never wrong."""
    entered = [False]

    def leave() -> None:
        entered[0] = False
        _leave()

    def enter(grad: torch.Tensor) -> torch.Tensor:
        if not entered[0]:
            entered[0] = True
            _enter()
            Variable._execution_engine.queue_callback(leave)
        return grad

    for t in outputs:
        if t.requires_grad:
            t.register_hook(enter)


def on_cuda(device: torch.device | None) -> bool:
    """Whether work on ``device`` needs ``caffe_float32`` (only CUDA has TF32)."""
    return device is not None and device.type == "cuda"
