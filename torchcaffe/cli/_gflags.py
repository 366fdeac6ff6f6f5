"""Caffe-tool style flags on argparse: ``-name=value``, ``--name value``, ``-flag``."""

from __future__ import annotations

import argparse


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
