"""Atomic file replacement, so a crash or an error mid-write never leaves half a model behind.

Caffe writes in place (``open(O_TRUNC)``); an interrupted snapshot then destroys the previous
one. Here the bytes go to a temporary file in the target's directory (same filesystem, so the
final ``os.replace`` is atomic), are fsynced, and only then take the target's name.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import IO, Any

PathLike = str | os.PathLike


def _umask() -> int:
    """The process umask, read without changing it (``os.umask`` is racy across threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _target_mode(path: str) -> int:
    """Keep the permissions of a file being replaced; new files get 0666 & ~umask, as open()."""
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_write(path: PathLike, mode: str = "wb", **open_kw: Any) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` for writing; on success it replaces ``path``.

    On any exception inside the block the temporary file is removed and ``path`` is untouched.
    ``mode`` must be a write mode (``"wb"``, ``"w"``, ``"w+b"``, ...); ``open_kw`` goes to
    ``open`` (e.g. ``encoding``).
    """
    if not mode.startswith("w"):
        raise ValueError(f"atomic_write needs a write mode ('w', 'wb', 'w+b'); got {mode!r}")
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=directory)
    try:
        try:
            f = os.fdopen(fd, mode, **open_kw)
        except BaseException:
            os.close(fd)
            raise
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _target_mode(target))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    """Make the rename itself durable where the platform allows opening a directory."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
