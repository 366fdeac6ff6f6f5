"""Atomic file replacement, so a crash or an error mid-write never leaves half a model behind.

Caffe writes in place (``open(O_TRUNC)``); an interrupted snapshot then destroys the previous
one. Here the bytes go to a temporary file beside the target (same filesystem, so the final
``os.replace`` is atomic), are fsynced, and only then take the target's name.

The temporary file is visible and says what it is: ``NAME.torchcaffe-tmp-XXXXXXXX`` beside
``NAME``. A process killed mid-write (``kill -9``, power loss) cannot remove it, so every save
of ``NAME`` first removes the temporaries an earlier, dead save of ``NAME`` left. A writer holds
an exclusive ``flock`` on its temporary file while it writes, so a save in progress in another
process is never mistaken for litter (where ``flock`` is unavailable, only temporaries older
than a day are removed).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
import time
from collections.abc import Iterator
from typing import IO, Any

from ..errors import FileWriteError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

PathLike = str | os.PathLike
TEMP_MARK = ".torchcaffe-tmp-"
STALE_WITHOUT_LOCKS_S = 24 * 3600
_LEGACY = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]{8}\.tmp$")  # before issue 13: hidden names


def current_umask() -> int:
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
        return 0o666 & ~current_umask()


def temp_files_of(path: PathLike) -> list[str]:
    """Temporary files beside ``path`` that a save of ``path`` creates (live or left over)."""
    target = os.path.abspath(os.fspath(path))
    directory, base = os.path.split(target)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for name in names:
        legacy = _LEGACY.match(name)
        if name.startswith(base + TEMP_MARK) or (legacy and legacy.group("name") == base):
            out.append(os.path.join(directory, name))
    return sorted(out)


def remove_stale_temp_files(path: PathLike) -> list[str]:
    """Remove what dead saves of ``path`` left behind; returns the files removed."""
    removed = []
    for tmp in temp_files_of(path):
        if _is_stale(tmp):
            with contextlib.suppress(FileNotFoundError, PermissionError):
                os.unlink(tmp)
                removed.append(tmp)
    return removed


def _is_stale(tmp: str) -> bool:
    if fcntl is None:
        try:
            return time.time() - os.stat(tmp).st_mtime > STALE_WITHOUT_LOCKS_S
        except OSError:
            return False
    try:
        fd = os.open(tmp, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: its writer is gone
        return True
    except OSError:
        return False  # a live writer holds it
    finally:
        os.close(fd)  # also drops the probe's lock


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
    if os.path.isdir(target):  # the rename would fail after all the bytes were written
        raise FileWriteError.of(IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)), target)
    remove_stale_temp_files(target)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=os.path.basename(target) + TEMP_MARK, suffix="", dir=directory
        )
    except OSError as err:  # named after the file asked for, not the temporary one
        raise FileWriteError.of(err, target) from None
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held until the fd closes (or the process dies)
        try:
            f = os.fdopen(fd, mode, **open_kw)
        except BaseException:
            os.close(fd)
            raise
        try:
            with f:
                yield f
                f.flush()
                os.fsync(f.fileno())
                if fcntl is not None:
                    _publish(tmp, target)  # still locked: no cleaner can take it for litter
        except FileWriteError:
            raise
        except OSError as err:
            if err.filename is not None or err.errno is None:
                raise  # about another file the block opened: its own name is the right one
            # a failed write (a full disk, a file size limit) names no file: name the target
            raise FileWriteError.of(err, target) from None
        except SystemError as err:  # h5py's file driver wraps the write's OSError in one
            cause = err.__cause__ or err.__context__
            if not isinstance(cause, OSError) or cause.errno is None:
                raise
            raise FileWriteError.of(cause, target) from None
        if fcntl is None:
            _publish(tmp, target)  # Windows cannot rename an open file
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


def _publish(tmp: str, target: str) -> None:
    os.chmod(tmp, _target_mode(target))
    try:
        os.replace(tmp, target)
    except OSError as err:  # named after the file asked for, not the temporary one
        raise FileWriteError.of(err, target) from None


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
