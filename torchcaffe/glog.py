"""Log lines in glog's format, as Caffe's tools write them.

``I1127 09:16:21.381027 25210 solver.cpp:204] Iteration 100, lr = 0.01``: severity letter,
month and day, time with microseconds, thread id, source file and line. Caffe's
``tools/extra/parse_log.py`` and ``plot_training_log.py`` read the time from that prefix
(``extract_seconds.py``), so a training log they can parse needs it.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
import threading
from collections.abc import Iterator

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
    keeps errors only); nothing added if ``quiet`` or ``log`` has handlers of its own (an
    application that set up logging)."""
    if quiet or log.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(_threshold())
    handler.setFormatter(GlogFormatter())
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
