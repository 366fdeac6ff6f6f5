"""Caffe's upgrade_solver_proto_text: upgrade a solver prototxt to the current format.

torchcaffe upgrade_solver_proto_text OLD_SOLVER.prototxt NEW_SOLVER.prototxt

The deprecated ``solver_type`` enum becomes the ``type`` string (``solver_type: ADAM`` ->
``type: "Adam"``); a solver that sets both is refused. Nothing else changes: nets given inline
stay as written and ``snapshot_prefix`` is not filled in. The output is printed as Caffe prints
it and written atomically.
"""

from __future__ import annotations

import argparse
import sys

from ..formats.prototxt import read_text_proto, write_text
from ..formats.upgrade import solver_needs_type_upgrade, upgrade_solver_as_needed
from ..proto import caffe_pb2 as pb


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input_file", help="old-format solver prototxt")
    p.add_argument("output_file", help="upgraded solver prototxt")


def main(args: argparse.Namespace) -> int:
    solver = read_text_proto(args.input_file, pb.SolverParameter)
    if solver_needs_type_upgrade(solver):
        print(
            "Attempting to upgrade input file specified using deprecated 'solver_type' field "
            f"(enum): {args.input_file}",
            file=sys.stderr,
        )
        solver = upgrade_solver_as_needed(solver, args.input_file)
        print(
            "Successfully upgraded file specified using deprecated 'solver_type' field (enum) "
            "to 'type' field (string).",
            file=sys.stderr,
        )
    else:
        print(f"File already in latest proto format: {args.input_file}", file=sys.stderr)
    write_text(solver, args.output_file)
    print(f"Wrote upgraded SolverParameter text proto to {args.output_file}")
    return 0
