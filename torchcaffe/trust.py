"""Whether code shipped with a model (``type: "Python"`` layers) may run.

A model directory is untrusted input: Python layers import and run arbitrary modules, so they
are refused unless the user opts in, per call (``allow_python_layers=True``) or per process
(environment variable ``TORCHCAFFE_ALLOW_PYTHON_LAYERS=1``, for pycaffe scripts that cannot
be edited).

Only an explicit yes-value enables (``1``, ``true``, ``yes``, ``on``; any case). ``0``,
``false``, ``no``, ``off`` and the empty string refuse. Anything else is a ``TrustError`` when
a Python layer asks: a typo in a security opt-in must neither enable nor pass unnoticed.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

from .errors import TrustError

ENV_VAR = "TORCHCAFFE_ALLOW_PYTHON_LAYERS"
YES_VALUES = ("1", "true", "yes", "on")
NO_VALUES = ("", "0", "false", "no", "off")
_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "allow_python_layers", default=False
)


def python_layers_allowed() -> bool:
    """Opted in by ``allow_python_layers`` or by an explicit yes-value of the variable."""
    return _allowed.get() or env_allows()


def env_allows() -> bool:
    raw = os.environ.get(ENV_VAR, "")
    value = raw.strip().lower()
    if value in YES_VALUES:
        return True
    if value in NO_VALUES:
        return False
    raise TrustError(
        f"{ENV_VAR}={raw!r} is not a recognised value",
        expected=f"one of {', '.join(YES_VALUES)} to allow Python layers, or one of "
        f"{', '.join(v for v in NO_VALUES if v)} (or unset) to refuse them",
        got=raw,
    )


@contextlib.contextmanager
def allow_python_layers(allowed: bool = True) -> Iterator[None]:
    """Within this block, nets being built may instantiate Python layers."""
    token = _allowed.set(bool(allowed) or _allowed.get())
    try:
        yield
    finally:
        _allowed.reset(token)
