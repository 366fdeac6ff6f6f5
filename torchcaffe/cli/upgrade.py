"""Upgrade an old (V0/V1, net-level input) net to the current format: text in, text out;
binary (a caffemodel) in, binary out.

torchcaffe upgrade OLD NEW   (the form follows the input; see also upgrade_net_proto_text and
                              upgrade_net_proto_binary, Caffe's tools, which insist on one form)
"""

from __future__ import annotations

import argparse
import logging
import os
import warnings

from ..errors import PrototxtError
from ..formats.prototxt import parse_net_auto, read_bytes, write_binary, write_text
from ..formats.upgrade import (
    IncompatibleUpgradeWarning,
    net_needs_data_upgrade,
    net_needs_upgrade,
    upgrade_net_as_needed,
)
from ..glog import on_stderr

# Caffe's upgrade tools LOG their lines (glog, stderr): ``on_stderr(log)`` around a tool's run
log = logging.getLogger("torchcaffe.upgrade")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="net to upgrade (text prototxt or binary caffemodel)")
    p.add_argument("target", help="where the upgraded net goes (same form as the source)")


def upgrade_file(source: str, target: str, form: str | None = None) -> tuple[str, bool]:
    """Caffe's upgrade_net_proto_{text,binary}: read, UpgradeNetAsNeeded, write the same form.

    ``form`` ("text" or "binary") insists on one form, as Caffe's two tools do; None follows
    the source. Returns the form written and whether the upgrade was fully compatible (no
    ``IncompatibleUpgradeWarning``; Caffe's tools exit 1 otherwise). Nothing is written when
    reading or upgrading fails.
    """
    net, binary = parse_net_auto(read_bytes(source), source)
    found = "binary" if binary else "text"
    if form is not None and found != form:
        other = "upgrade_net_proto_binary" if binary else "upgrade_net_proto_text"
        raise PrototxtError(
            f"this is a {found} proto, not {form}",
            path=source,
            hint=f"use `torchcaffe {other}` (or `torchcaffe upgrade`, which keeps the form)",
        )
    compatible = True
    if net_needs_upgrade(net) or net_needs_data_upgrade(net):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            net = upgrade_net_as_needed(net, source)
        for w in caught:  # raised again, under the caller's filters
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        compatible = not any(issubclass(w.category, IncompatibleUpgradeWarning) for w in caught)
    else:
        # Caffe logs it (at ERROR) and writes the net unchanged, exit status 0
        log.error("File already in latest proto format: %s", source)
    (write_binary if binary else write_text)(net, target)
    return found, compatible


def status(compatible: bool) -> int:
    """The exit status of Caffe's upgrade tools: 1 when the upgrade logged errors."""
    if not compatible:
        log.error("Encountered error(s) while upgrading prototxt; see details above.")
    return 0 if compatible else 1


def main(args: argparse.Namespace) -> int:
    with on_stderr(log):
        form, compatible = upgrade_file(args.source, args.target)
        size = os.path.getsize(args.target)
        print(f"upgraded {args.source} -> {args.target} ({form}, {size} bytes)")
        return status(compatible)
