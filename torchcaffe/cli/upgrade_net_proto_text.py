"""Caffe's upgrade_net_proto_text: upgrade a V0/V1 text prototxt to the current format.

torchcaffe upgrade_net_proto_text INPUT.prototxt OUTPUT.prototxt
"""

from __future__ import annotations

import argparse

from .upgrade import status, upgrade_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input_file", help="old-format text prototxt")
    p.add_argument("output_file", help="upgraded text prototxt")


def main(args: argparse.Namespace) -> int:
    _, compatible = upgrade_file(args.input_file, args.output_file, form="text")
    print(f"Wrote upgraded NetParameter text proto to {args.output_file}")
    return status(compatible)
