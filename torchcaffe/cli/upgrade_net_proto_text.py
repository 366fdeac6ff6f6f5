"""Caffe's upgrade_net_proto_text: upgrade a V0/V1 text prototxt to the current format.

torchcaffe upgrade_net_proto_text INPUT.prototxt OUTPUT.prototxt
"""

from __future__ import annotations

import argparse

from ..glog import on_stderr
from .upgrade import log, status, upgrade_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input_file", help="old-format text prototxt")
    p.add_argument("output_file", help="upgraded text prototxt")


def main(args: argparse.Namespace) -> int:
    """Caffe's tool: its lines logged to stderr with glog's prefix, nothing on stdout."""
    with on_stderr(log):
        _, compatible = upgrade_file(args.input_file, args.output_file, form="text")
        log.info("Wrote upgraded NetParameter text proto to %s", args.output_file)
        return status(compatible)
