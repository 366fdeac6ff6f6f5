"""Caffe's upgrade_solver_proto_text: upgrade a solver prototxt to the current format.

torchcaffe upgrade_solver_proto_text OLD_SOLVER.prototxt NEW_SOLVER.prototxt

The deprecated ``solver_type`` enum becomes the ``type`` string (``solver_type: ADAM`` ->
``type: "Adam"``); a solver that sets both is refused. Nothing else changes: nets given inline
stay as written and ``snapshot_prefix`` is not filled in. The output is printed as Caffe prints
it and written atomically.
"""

from __future__ import annotations

import argparse

from ..formats.prototxt import read_text_proto, write_text
from ..formats.upgrade import solver_needs_type_upgrade, upgrade_solver_as_needed
from ..glog import on_stderr
from ..proto import caffe_pb2 as pb
from .upgrade import log


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input_file", help="old-format solver prototxt")
    p.add_argument("output_file", help="upgraded solver prototxt")


def main(args: argparse.Namespace) -> int:
    """Caffe's tool: its lines logged to stderr with glog's prefix, nothing on stdout."""
    with on_stderr(log):
        solver = read_text_proto(args.input_file, pb.SolverParameter)
        if solver_needs_type_upgrade(solver):
            log.info(
                "Attempting to upgrade input file specified using deprecated 'solver_type' "
                "field (enum): %s",
                args.input_file,
            )
            solver = upgrade_solver_as_needed(solver, args.input_file)
            log.info(
                "Successfully upgraded file specified using deprecated 'solver_type' field "
                "(enum) to 'type' field (string)."
            )
        else:
            log.error("File already in latest proto format: %s", args.input_file)
        write_text(solver, args.output_file)
        log.info("Wrote upgraded SolverParameter text proto to %s", args.output_file)
    return 0
