"""Compare torchcaffe with another engine, layer by layer, on the same input.

torchcaffe compare NET.prototxt WEIGHTS --against opencv|onnxruntime|caffe
                   [--input data=FILE.npy | --input random] [--phase test] [--tolerance 1e-4]
                   [--json] [--against-weights ORIGINAL.caffemodel]
Prints one row per layer top (shape, max abs diff, max rel diff) and the first layer whose
output diverges beyond the tolerance; exits 1 when one does.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from ..converters.compare import ENGINES, compare
from ..errors import DataError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prototxt")
    p.add_argument("weights")
    p.add_argument("--against", required=True, choices=ENGINES)
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="BLOB=FILE.npy|random",
        help="input values (repeatable); default: seeded uniform(-1, 1) in the declared shape",
    )
    p.add_argument("--phase", default="test", choices=["train", "test"])
    p.add_argument("--tolerance", type=float, default=1e-4, help="max relative difference")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument(
        "--against-weights",
        metavar="W.caffemodel",
        help="weights for the other engine (default: the same WEIGHTS)",
    )


def load_inputs(items: list[str]) -> dict[str, np.ndarray]:
    inputs: dict[str, np.ndarray] = {}
    for item in items:
        if item == "random":
            continue
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise DataError("bad --input", expected="BLOB=FILE.npy or random", got=item)
        if path == "random":
            continue
        try:
            inputs[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise DataError(f"cannot read the input array: {err}", path=path) from None
    return inputs


def main(args: argparse.Namespace) -> int:
    result = compare(
        args.prototxt,
        args.weights,
        args.against,
        inputs=load_inputs(args.input),
        phase=args.phase,
        tolerance=args.tolerance,
        seed=args.seed,
        other_weights=args.against_weights,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(result.table())
    return 0 if result.first_divergent is None else 1
