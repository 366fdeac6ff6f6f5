"""Caffe's upgrade_net_proto_binary: upgrade a V0/V1 binary net (a caffemodel, weights kept)
to the current format, written as binary.

torchcaffe upgrade_net_proto_binary INPUT.caffemodel OUTPUT.caffemodel
"""

from __future__ import annotations

import argparse

from ..glog import on_stderr
from .upgrade import log, status, upgrade_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input_file", help="old-format binary NetParameter (e.g. a V1 caffemodel)")
    p.add_argument("output_file", help="upgraded binary NetParameter")


def main(args: argparse.Namespace) -> int:
    """Caffe's tool: its lines logged to stderr with glog's prefix, nothing on stdout."""
    with on_stderr(log):
        _, compatible = upgrade_file(args.input_file, args.output_file, form="binary")
        log.info("Wrote upgraded NetParameter binary proto to %s", args.output_file)
        return status(compatible)
