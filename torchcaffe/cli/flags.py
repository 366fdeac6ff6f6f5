"""gflags-style flags for argparse: `-flag value`, `--flag value`, `-flag=value`, `--flag=value`.

Caffe's tools take their flags through gflags, where one dash and two are the same and
``-weights=a,b`` works. argparse only knows ``--weights``; ``gflags_argv`` rewrites a
single-dash long flag to the option string the action's parser declares (``-sigint_effect``
also finds ``--sigint-effect``) before argparse sees it, with gflags' boolean spellings
(``-noshuffle``, ``-shuffle=yes``); glog's flags (``-log_dir``, ``-v``, ...) and, for the caffe
tool's actions, each other's flags are taken and ignored, as gflags does. Anything else it does
not recognise is left alone, so argparse still reports it as unknown. ``add_flag`` declares a
flag the way Caffe's image tools spell booleans (bare ``-shuffle``, or ``-shuffle=true`` /
``=0``).
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from ..errors import DeviceError, UsageError

_LONG = re.compile(r"^--?([A-Za-z][\w-]*)(=.*)?$", re.DOTALL)


# glog's own flags, which every Caffe tool accepts (GlobalInit parses them); we log through
# Python's logging, so they are taken and ignored
GLOG_VALUED = frozenset(
    {"log_dir", "minloglevel", "stderrthreshold", "v", "vmodule", "max_log_size",
     "logbufsecs", "logbuflevel", "log_link"}
)  # fmt: skip
GLOG_BOOLS = frozenset(
    {"logtostderr", "alsologtostderr", "colorlogtostderr", "log_prefix",
     "stop_logging_if_full_disk", "timestamp_in_logfile_name"}
)  # fmt: skip
# The caffe tool defines its flags globally: each action takes every one of them, and uses
# only its own (``caffe time -weights w`` runs, ignoring -weights)
CAFFE_VALUED = frozenset(
    {"gpu", "solver", "model", "snapshot", "weights", "iterations", "phase", "level", "stage",
     "sigint_effect", "sighup_effect"}
)  # fmt: skip
# gflags' spellings of a boolean's value, any case
_TRUTH = {"true": "true", "t": "true", "yes": "true", "y": "true", "1": "true",
          "false": "false", "f": "false", "no": "false", "n": "false", "0": "false"}  # fmt: skip


def gflags_argv(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    ignored: frozenset[str] = frozenset(),
    dropped_glog: list[str] | None = None,
) -> list[str]:
    """``argv`` with every single- or double-dash long flag spelt as ``parser`` declares it;
    a boolean's gflags spellings (``-noflag``, ``-flag=yes``, ``=F``) as its own; glog's flags
    and those in ``ignored`` (with their values) dropped, as gflags takes and ignores them
    (the glog ones named in ``dropped_glog``: torchcaffe logs to stderr only, so the caller
    says they had no effect)."""
    known = {
        s.lstrip("-"): s for action in parser._actions for s in action.option_strings
    }  # argparse keeps no public list of option strings
    switches = {
        s: action.option_strings
        for action in parser._actions
        if isinstance(action, argparse._StoreTrueAction)
        for s in action.option_strings
    }  # plain store_true flags (``-allow_python_layers``) take gflags' spellings too
    out: list[str] = []
    skip_value = False
    for i, token in enumerate(argv):
        if skip_value:
            skip_value = False
            continue
        if token == "--":
            out.extend(argv[i:])
            break
        match = _LONG.match(token)
        if match:
            name, value = match.group(1), match.group(2) or ""
            truth = _TRUTH.get(value[1:].lower())
            if truth and _declared(known, f"{name}=true"):  # a boolean: -flag=yes, -flag=F
                declared, value = _declared(known, f"{name}={truth}"), ""
            else:
                declared = _declared(known, name)
            if declared is None and name.startswith("no") and not value:  # -noflag
                declared = _declared(known, f"{name[2:]}=false")
                switch = _declared(known, name[2:])
                if declared is None and switch in switches:
                    declared, value, truth = switch, "", "false"
            if declared in switches and (truth or not value):
                if truth == "false":  # gflags' last spelling wins: drop the earlier ones
                    out = [t for t in out if t not in switches[declared]]
                    continue
                value = ""
            if declared is not None:
                token = declared + value
            elif name in GLOG_BOOLS or name.startswith("no") and name[2:] in GLOG_BOOLS:
                if dropped_glog is not None:
                    dropped_glog.append(name)
                continue
            elif name in GLOG_VALUED or name in ignored:
                if dropped_glog is not None and name in GLOG_VALUED:
                    dropped_glog.append(name)
                skip_value = not value  # ``-log_dir /tmp``: the next token is its value
                continue
        out.append(token)
    return out


# glog's flags acted on: -minloglevel (lines below it are dropped), -log_dir and
# -logtostderr (log files, or none); the others are taken and ignored
GLOG_ACTED_ON = frozenset({"minloglevel", "log_dir", "logtostderr"})


def expand_flag_sources(argv: Sequence[str], program: str, environ: Mapping[str, str]) -> list[str]:
    """``argv`` with gflags' own flags replaced by the flags they stand for, in place (later
    flags override earlier ones, as gflags reads them in order):

    - ``--flagfile=F`` (``-flagfile F``): F's lines, each a flag (``--solver=s.prototxt``),
      ``#`` comments and blank lines skipped. A line not starting with ``-`` lists program
      names (globs); the flags after it apply only if one matches ``program`` (``caffe`` for
      the caffe tool's actions). A flagfile may name another.
    - ``--fromenv=a,b``: ``--a=$FLAGS_a`` for each (an error where one is not set);
      ``--tryfromenv=a,b`` the same, skipping those not set.
    """
    out: list[str] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        match = _LONG.match(token)
        name = match.group(1) if match else None
        if token == "--":  # gflags stops at it: what follows is positional
            out.extend(tokens[i:])
            break
        if match is None or name not in ("flagfile", "fromenv", "tryfromenv"):
            out.append(token)
            i += 1
            continue
        if match.group(2):
            value, i = match.group(2)[1:], i + 1
        elif i + 1 < len(tokens):
            value, i = tokens[i + 1], i + 2
        else:
            raise UsageError(f"flag '--{name}' is missing its argument")
        if name == "flagfile":
            out.extend(expand_flag_sources(_flagfile_flags(value, program), program, environ))
            continue
        for flag in (n.strip() for n in value.split(",") if n.strip()):
            if f"FLAGS_{flag}" in environ:
                out.append(f"--{flag}={environ[f'FLAGS_{flag}']}")
            elif name == "fromenv":
                raise UsageError(
                    f"--fromenv: FLAGS_{flag} not found in the environment",
                    hint=f"export FLAGS_{flag}=..., or use --tryfromenv",
                )
    return out


def _flagfile_flags(path: str, program: str) -> list[str]:
    """The flags a gflags flagfile gives ``program`` (``expand_flag_sources``)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise UsageError(
            f"--flagfile: cannot read {path!r} ({err.strerror})", expected="a file of flags"
        ) from None
    flags: list[str] = []
    applies = True
    for line in (raw.strip() for raw in lines):
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            if applies:
                flags.append(line)
            continue
        applies = any(fnmatch.fnmatchcase(program, glob) for glob in line.split())
    return flags


def glog_minloglevel(argv: Sequence[str]) -> int | None:
    """glog's -minloglevel in ``argv`` (``-minloglevel=2``, ``--minloglevel 2``; the last
    wins), or None."""
    value = _glog_value(argv, "minloglevel")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(
            "illegal value for glog's -minloglevel", expected="an integer 0-3", got=value
        ) from None


def glog_log_dir(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """Where glog writes its log files: ``-log_dir`` in ``argv`` (the last wins), else the
    environment's GLOG_log_dir (glog takes a flag's default from GLOG_<flag>); None with
    ``-logtostderr`` (or GLOG_logtostderr true), which logs to stderr only, or no directory
    given (glog would write to /tmp; torchcaffe leaves no files nobody asked for)."""
    to_stderr = environ.get("GLOG_logtostderr", "").lower() in ("1", "t", "true", "y", "yes")
    for token in argv:
        match = _LONG.match(token)
        if match and match.group(1) in ("logtostderr", "nologtostderr"):
            value = (match.group(2) or "=true")[1:].lower()
            to_stderr = (_TRUTH.get(value) == "true") == (match.group(1) == "logtostderr")
    if to_stderr:
        return None
    value = _glog_value(argv, "log_dir")
    return value if value is not None else environ.get("GLOG_log_dir")


def _glog_value(argv: Sequence[str], name: str) -> str | None:
    """The value of glog's valued flag ``name`` in ``argv`` (``-name=v``, ``--name v``; the
    last wins), or None."""
    value = None
    for i, token in enumerate(argv):
        match = _LONG.match(token)
        if match and match.group(1) == name:
            given = match.group(2)
            value = given[1:] if given else (argv[i + 1] if i + 1 < len(argv) else "")
    return value


def _declared(known: dict[str, str], name: str) -> str | None:
    """The option string ``parser`` declares for ``name`` (``_`` and ``-`` alike), if any."""
    for spelling in (name, name.replace("_", "-"), name.replace("-", "_")):
        if spelling in known and known[spelling].startswith("--"):
            return known[spelling]
    return None


def add_flag(p: argparse.ArgumentParser, name: str, default: object, help: str) -> None:
    """One gflags-style flag accepted as ``-name`` and ``--name`` (bools: bare or =value)."""
    names = [f"-{name}", f"--{name}"]
    if isinstance(default, bool):
        # Bare -name sets it; -name=true/false (and 1/0) are their own option strings, so a
        # bare flag never swallows the positional that follows it.
        p.add_argument(
            *names, dest=name, action="store_const", const=True, default=default, help=help
        )
        for value, truth in (("true", True), ("false", False), ("1", True), ("0", False)):
            p.add_argument(
                *(f"{n}={value}" for n in names),
                dest=name,
                action="store_const",
                const=truth,
                help=argparse.SUPPRESS,
            )
    else:
        p.add_argument(*names, dest=name, default=default, type=type(default), help=help)


def add_net_state_flags(p: argparse.ArgumentParser, *, which: str = "net") -> None:
    """Caffe's ``-level`` / ``-stage`` (the NetState rules pick layers by) and the opt-in for
    Python layers, shared by the actions that build nets."""
    p.add_argument("--level", type=int, default=0, help=f"{which} state level")
    p.add_argument("--stage", default="", help=f"{which} state stages, comma-separated")
    add_python_layers_flag(p)


def add_python_layers_flag(p: argparse.ArgumentParser) -> None:
    """``--allow-python-layers``: run Python layers' code (trusted models only)."""
    p.add_argument(
        "--allow-python-layers",
        "--allow_python_layers",
        action="store_true",
        help="run Python layers' code (only for models you trust)",
    )


def require(value: str, flag: str, need: str) -> None:
    """caffe.cpp's CHECK that a flag is not empty (``-solver=`` gives ""): its words, the flag."""
    if not value.strip():
        raise UsageError(f"{need} (-{flag} is empty)", expected=f"-{flag} FILE")


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (``prog: error: ...``), exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def gpu_ids(value: str | None, available: int) -> list[int]:
    """Caffe's get_gpus: ``""``/None -> [] (CPU), ``all`` -> every device, ``0,1`` -> ids.

    A negative id means the CPU, as many Caffe scripts pass ``-gpu -1``.
    """
    if value is None or value.strip() == "":
        return []
    if value.strip() == "all":
        return list(range(available))
    try:
        ids = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise DeviceError(
            "bad -gpu value", expected="all, a device id or ids like 0,1", got=value
        ) from None
    if any(i < 0 for i in ids):
        if len(ids) > 1:
            raise DeviceError("bad -gpu value", expected="-1 (CPU) alone", got=value)
        return []
    return ids
