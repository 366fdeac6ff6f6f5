"""Log lines in glog's format, as Caffe's tools write them.

``I1127 09:16:21.381027 25210 solver.cpp:204] Iteration 100, lr = 0.01``: severity letter,
month and day, time with microseconds, thread id, source file and line. Caffe's
``tools/extra/parse_log.py`` and ``plot_training_log.py`` read the time from that prefix
(``extract_seconds.py``), so a training log they can parse needs it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import getpass
import logging
import os
import socket
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

# glog's severities 0..3 (INFO, WARNING, ERROR, FATAL) as logging's levels
_SEVERITY_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
# -minloglevel given on a command line (``minloglevel``); else glog's GLOG_minloglevel
_flag_minloglevel: int | None = None


@contextlib.contextmanager
def minloglevel(level: int | None) -> Iterator[None]:
    """glog's -minloglevel for the block (None: the GLOG_minloglevel environment variable, as
    glog takes any flag's default from GLOG_<flag>): lines below that severity are dropped."""
    global _flag_minloglevel
    previous, _flag_minloglevel = _flag_minloglevel, level
    try:
        yield
    finally:
        _flag_minloglevel = previous


def _threshold() -> int:
    """The logging level of glog's minloglevel now (0, INFO, where it is unset or unreadable)."""
    level = _flag_minloglevel
    if level is None:
        try:
            level = int(os.environ.get("GLOG_minloglevel", "0"))
        except ValueError:
            level = 0
    return _SEVERITY_LEVELS[min(max(level, 0), len(_SEVERITY_LEVELS) - 1)]


class GlogFormatter(logging.Formatter):
    """``logging`` records as glog lines (``logging``'s level letters: I, W, E, C).

    The thread id is the OS's (glog's ``GetTID()``, gettid on Linux: the process id for the
    main thread), right-aligned in 5 columns as glog writes it, not Python's thread ident.
    A StreamHandler formats in the logging thread, so it is read here."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created)
        prefix = (
            f"{record.levelname[:1]}{when:%m%d %H:%M:%S}.{when.microsecond:06d} "
            f"{threading.get_native_id():>5} {record.filename}:{record.lineno}] "
        )
        return prefix + super().format(record)


@contextlib.contextmanager
def on_stderr(log: logging.Logger, quiet: bool = False) -> Iterator[None]:
    """``log``'s INFO lines on stderr in glog's format for the block, as Caffe's tools log
    (``FLAGS_alsologtostderr``), less those below glog's minloglevel (``GLOG_minloglevel=2``
    keeps errors only), and in glog's log files where ``log_files`` opened them; nothing
    added if ``quiet`` or ``log`` has handlers of its own (an application that set up
    logging)."""
    if quiet or log.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(_threshold())
    handler.setFormatter(GlogFormatter())
    handlers = [handler, *_log_file_handlers]  # glog's files get what stderr gets
    level = log.level
    for each in handlers:
        log.addHandler(each)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        for each in handlers:
            log.removeHandler(each)
        log.setLevel(level)


# glog's severities by name, for its log file names
_SEVERITY_NAMES = ("INFO", "WARNING", "ERROR")


class _SeverityFile(logging.Handler):
    """One of glog's log files: every line of ``severity`` or above, in
    ``<dir>/<program>.<host>.<user>.log.<SEVERITY>.<yyyymmdd-hhmmss>.<pid>``, created at its
    first line with glog's header, and the link ``<dir>/<program>.<SEVERITY>`` to it (glog
    replaces that link with each new file: ``caffe.INFO`` is always the latest run's log)."""

    def __init__(self, directory: str, program: str, severity: int) -> None:
        super().__init__(max(_SEVERITY_LEVELS[severity], _threshold()))
        self.directory, self.program = directory, program
        self.severity = _SEVERITY_NAMES[severity]
        self.stream: TextIO | None = None
        self.failed = False
        self.setFormatter(GlogFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None and not self.failed:
            self.stream = self._create()
        if self.stream is not None:
            self.stream.write(self.format(record) + "\n")
            self.stream.flush()

    def _create(self) -> TextIO | None:
        now = datetime.datetime.now()
        user = os.environ.get("USER") or _user()
        name = (
            f"{self.program}.{socket.gethostname()}.{user}.log.{self.severity}."
            f"{now:%Y%m%d-%H%M%S}.{os.getpid()}"
        )
        try:
            stream, name = _new_file(self.directory, name)
        except OSError as err:  # glog says so on stderr and goes on logging there
            self.failed = True
            print(f"Could not create log file: {err.strerror}: {err.filename}", file=sys.stderr)
            return None
        stream.write(
            f"Log file created at: {now:%Y/%m/%d %H:%M:%S}\n"
            f"Running on machine: {socket.gethostname()}\n"
            "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg\n"
        )
        link = os.path.join(self.directory, f"{self.program}.{self.severity}")
        staging = f"{link}.{os.getpid()}.tmp"
        try:
            os.symlink(name, staging)
            os.replace(staging, link)
        except OSError:  # no links here (some filesystems): the file stays, the link goes
            with contextlib.suppress(OSError):
                os.unlink(staging)
        return stream

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        super().close()


def _new_file(directory: str, name: str) -> tuple[TextIO, str]:
    """A new file ``name`` in ``directory``, opened for writing, and its name: a run of this
    process in the same second as an earlier one (glog's names are per second and process)
    gets ``name.1``, ``name.2``, ..., not the earlier run's file."""
    for n in range(1000):
        candidate = name if n == 0 else f"{name}.{n}"
        try:
            return open(os.path.join(directory, candidate), "x", encoding="utf-8"), candidate
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "too many log files this second", name)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return "invalid-user"


# the handlers of the log files ``log_files`` opened, which ``on_stderr`` adds beside its own
_log_file_handlers: list[logging.Handler] = []


@contextlib.contextmanager
def log_files(directory: str | None, program: str) -> Iterator[None]:
    """glog's log files for the block, when there is a log ``directory`` (``-log_dir``; None
    or "": none, as with ``-logtostderr``): what ``on_stderr`` logs goes also to one file per
    severity, INFO, WARNING and ERROR, each taking its severity and above
    (``_SeverityFile``), as Caffe's tools log to files besides stderr. Pipelines read
    ``<dir>/caffe.INFO`` with parse_log.py."""
    if not directory:
        yield
        return
    handlers = [_SeverityFile(directory, program, s) for s in range(len(_SEVERITY_NAMES))]
    _log_file_handlers.extend(handlers)
    try:
        yield
    finally:
        for handler in handlers:
            _log_file_handlers.remove(handler)
            handler.close()
