"""Upgrade an old (V0/V1, net-level input) prototxt to the current format, as Caffe's tool.

torchcaffe upgrade OLD.prototxt NEW.prototxt
"""

from __future__ import annotations

import argparse

from ..formats.prototxt import read_net, write_text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source")
    p.add_argument("target")


def main(args: argparse.Namespace) -> int:
    write_text(read_net(args.source), args.target)
    print(f"upgraded {args.source} -> {args.target}")
    return 0
