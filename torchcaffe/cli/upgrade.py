"""Upgrade an old (V0/V1, net-level input) net to the current format: text in, text out;
binary (a caffemodel) in, binary out.

torchcaffe upgrade OLD NEW   (the form follows the input; see also upgrade_net_proto_text and
                              upgrade_net_proto_binary, Caffe's tools, which insist on one form)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import PrototxtError
from ..formats.prototxt import (
    BINARY_SUFFIXES,
    TEXT_SUFFIXES,
    parse_binary_proto,
    parse_text_proto,
    read_bytes,
    write_binary,
    write_text,
)
from ..formats.upgrade import net_needs_data_upgrade, net_needs_upgrade, upgrade_net_as_needed
from ..proto import caffe_pb2 as pb


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="net to upgrade (text prototxt or binary caffemodel)")
    p.add_argument("target", help="where the upgraded net goes (same form as the source)")


def is_binary(data: bytes, path: str) -> bool:
    """Binary protobuf rather than text: by extension, else by content (text is UTF-8 and
    parses as a NetParameter)."""
    suffix = Path(path).suffix.lower()
    if suffix in BINARY_SUFFIXES:
        return True
    if suffix in TEXT_SUFFIXES:
        return False
    try:
        parse_text_proto(data.decode("utf-8"), pb.NetParameter, path)
    except (UnicodeDecodeError, PrototxtError):
        return True
    return False


def upgrade_file(source: str, target: str, form: str | None = None) -> str:
    """Caffe's upgrade_net_proto_{text,binary}: read, UpgradeNetAsNeeded, write the same form.

    ``form`` ("text" or "binary") insists on one form, as Caffe's two tools do; None follows
    the source. Returns the form written. Nothing is written when reading or upgrading fails.
    """
    data = read_bytes(source)
    binary = is_binary(data, source)
    found = "binary" if binary else "text"
    if form is not None and found != form:
        other = "upgrade_net_proto_binary" if binary else "upgrade_net_proto_text"
        raise PrototxtError(
            f"this is a {found} proto, not {form}",
            path=source,
            hint=f"use `torchcaffe {other}` (or `torchcaffe upgrade`, which keeps the form)",
        )
    net = (
        parse_binary_proto(data, pb.NetParameter, source)
        if binary
        else parse_text_proto(data, pb.NetParameter, source)
    )
    if net_needs_upgrade(net) or net_needs_data_upgrade(net):
        net = upgrade_net_as_needed(net, source)
    else:
        print("File already in latest proto format; writing it unchanged.", file=sys.stderr)
    (write_binary if binary else write_text)(net, target)
    return found


def main(args: argparse.Namespace) -> int:
    form = upgrade_file(args.source, args.target)
    print(f"upgraded {args.source} -> {args.target} ({form}, {os.path.getsize(args.target)} bytes)")
    return 0
