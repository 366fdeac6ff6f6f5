"""Which aten ops a piece of code dispatches."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class RecordOps(TorchDispatchMode):
    """Inside it, every aten op dispatched is recorded by name in ``names`` (its overload,
    e.g. "le.Scalar"). On the meta device that is what a GPU would launch."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))
