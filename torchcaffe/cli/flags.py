"""gflags-style flags for argparse: `-flag value`, `--flag value`, `-flag=value`, `--flag=value`.

Caffe's tools take their flags through gflags, where one dash and two are the same and
``-weights=a,b`` works. argparse only knows ``--weights``; ``gflags_argv`` rewrites a
single-dash long flag to the option string the action's parser declares (``-sigint_effect``
also finds ``--sigint-effect``) before argparse sees it. Anything it does not recognise is left
alone, so argparse still reports it as unknown. ``add_flag`` declares a flag the way Caffe's
image tools spell booleans (bare ``-shuffle``, or ``-shuffle=true`` / ``=0``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from ..errors import DeviceError

_LONG = re.compile(r"^--?([A-Za-z][\w-]+)(=.*)?$", re.DOTALL)


def gflags_argv(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``argv`` with every single- or double-dash long flag spelt as ``parser`` declares it."""
    known = {
        s.lstrip("-"): s for action in parser._actions for s in action.option_strings
    }  # argparse keeps no public list of option strings
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            out.extend(argv[i:])
            break
        match = _LONG.match(token)
        if match:
            name, value = match.group(1), match.group(2) or ""
            for spelling in (name, name.replace("_", "-"), name.replace("-", "_")):
                if spelling in known and known[spelling].startswith("--"):
                    token = known[spelling] + value
                    break
        out.append(token)
    return out


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
