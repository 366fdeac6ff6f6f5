"""Resource limits on what a loaded file may ask for, checked before anything is allocated.

A model from the internet is untrusted input: a 3 KB file can declare a blob of 10^12 floats.
Every reader and the net builder check declared sizes against these limits first and raise a
``TorchCaffeError`` naming the file and what it asked for. Defaults follow Caffe where Caffe
has a limit (``kMaxBlobAxes`` = 32 axes; ``Blob::Reshape`` refuses a count over INT_MAX) and
are generous elsewhere. See ``docs/limits.md``.

Change them per process with environment variables (read when first needed), or in code::

    torchcaffe.limits.set(max_blob_elements=2**33)      # for the rest of the process
    with torchcaffe.limits.override(max_layers=10):     # inside this block (and thread/task)
        torchcaffe.load(...)
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .errors import ConfigError, UsageError

INT_MAX = 2**31 - 1
ENV_PREFIX = "TORCHCAFFE_"


@dataclass(frozen=True)
class Limits:
    """The limits in force. Field ``x`` is set by the environment variable ``TORCHCAFFE_X``."""

    max_blob_elements: int = INT_MAX  # Caffe's Blob::Reshape: count <= INT_MAX
    max_axes: int = 32  # Caffe's kMaxBlobAxes
    max_proto_bytes: int = 2**31 - 1  # files read whole: prototxt, solverstate, binaryproto
    max_weights_bytes: int = 64 * 2**30  # caffemodel files (memory-mapped, not read whole)
    max_layers: int = 1_000_000  # layers in one NetParameter

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"limit {f.name} must be a positive integer",
                    expected="an int >= 1",
                    got=f"{value!r} ({type(value).__name__})",
                )


_FIELDS = tuple(f.name for f in dataclasses.fields(Limits))
_process: Limits | None = None
_scoped: contextvars.ContextVar[Limits | None] = contextvars.ContextVar(
    "torchcaffe_limits", default=None
)


def _from_env() -> Limits:
    values = {}
    for name in _FIELDS:
        var = ENV_PREFIX + name.upper()
        raw = os.environ.get(var, "").strip()
        if not raw:
            continue
        problem = None
        try:
            values[name] = int(raw.replace("_", ""), 0)
        except ValueError:
            problem = "is not an integer"
        else:
            if values[name] < 1:
                problem = "is not positive"
        if problem:
            raise ConfigError(
                f"environment variable {var}={raw!r} {problem}",
                expected=f"a positive integer limit for {name} (decimal, 0x hex, _ separators)",
                got=repr(raw),
                hint=f"unset {var} for the default {getattr(Limits, name)}; see docs/limits.md",
            )
    return Limits(**values)


def get() -> Limits:
    """The limits in force here: an ``override`` block, else ``set``, else env and defaults."""
    scoped = _scoped.get()
    if scoped is not None:
        return scoped
    global _process
    if _process is None:
        _process = _from_env()
    return _process


def set(**values: int) -> Limits:  # noqa: A001 - reads as torchcaffe.limits.set(...)
    """Change limits for the whole process (fields of ``Limits``); returns the new limits."""
    global _process
    _process = _replace(_process or _from_env(), values)
    return _process


def reset() -> Limits:
    """Back to the environment variables and defaults."""
    global _process
    _process = None
    return get()


@contextlib.contextmanager
def override(**values: int) -> Iterator[Limits]:
    """Limits changed inside this block only (per thread / asyncio task)."""
    token = _scoped.set(_replace(get(), values))
    try:
        yield _scoped.get()  # type: ignore[misc]
    finally:
        _scoped.reset(token)


def _replace(base: Limits, values: dict[str, int]) -> Limits:
    unknown = sorted(k for k in values if k not in _FIELDS)
    if unknown:
        raise UsageError("unknown limit(s)", expected=list(_FIELDS), got=unknown)
    return dataclasses.replace(base, **values)


# -- checks shared by the readers ---------------------------------------------------------------
def shape_problem(shape: Sequence[int]) -> str | None:
    """Why a blob of ``shape`` may not exist (negative, too many axes, too many elements)."""
    lim = get()
    if len(shape) > lim.max_axes:
        return f"{len(shape)} axes, more than the limit of {lim.max_axes} (max_axes)"
    count = 1
    for d in shape:
        if d < 0:
            return f"negative dimension {d}"
        count *= d
    if count > lim.max_blob_elements:
        return (
            f"{count} elements, more than the limit of {lim.max_blob_elements} "
            f"(max_blob_elements; Caffe refuses a blob over INT_MAX elements)"
        )
    return None


def shape_text(shape: Sequence[int]) -> str:
    """``shape`` for an error message: a refused shape may have thousands of axes (a hostile
    file), so a long one shows its ends and its axis count."""
    dims = [int(d) for d in shape]
    if len(dims) <= 16:
        return str(dims)
    ends = ", ".join(map(str, dims[:4])) + ", ..., " + ", ".join(map(str, dims[-2:]))
    return f"[{ends}] ({len(dims)} axes)"


def file_size_problem(size: int, *, weights: bool = False) -> str | None:
    """Why a file of ``size`` bytes is refused, or None."""
    lim = get()
    cap, name = (
        (lim.max_weights_bytes, "max_weights_bytes")
        if weights
        else (lim.max_proto_bytes, "max_proto_bytes")
    )
    if size > cap:
        return f"file of {size} bytes is over the limit of {cap} ({name})"
    return None
