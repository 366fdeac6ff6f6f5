"""Whether code shipped with a model (``type: "Python"`` layers) may run.

A model directory is untrusted input: Python layers import and run arbitrary modules, so they
are refused unless the user opts in, per call (``allow_python_layers=True``) or per process
(environment variable ``TORCHCAFFE_ALLOW_PYTHON_LAYERS=1``, for pycaffe scripts that cannot
be edited).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

ENV_VAR = "TORCHCAFFE_ALLOW_PYTHON_LAYERS"
_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "allow_python_layers", default=False
)


def python_layers_allowed() -> bool:
    return _allowed.get() or os.environ.get(ENV_VAR, "") not in ("", "0", "false", "False")


@contextlib.contextmanager
def allow_python_layers(allowed: bool = True) -> Iterator[None]:
    """Within this block, nets being built may instantiate Python layers."""
    token = _allowed.set(bool(allowed) or _allowed.get())
    try:
        yield
    finally:
        _allowed.reset(token)
