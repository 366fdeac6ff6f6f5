"""Compute the mean image of a database of Datums, as Caffe's compute_image_mean.

torchcaffe compute_image_mean [-backend=lmdb] INPUT_DB [OUTPUT_FILE]
"""

from __future__ import annotations

import argparse

from ..data.tools import compute_image_mean, default_progress
from .flags import add_flag


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_flag(p, "backend", "lmdb", "the backend {lmdb, leveldb} of the input database")
    p.add_argument("input_db")
    p.add_argument("output_file", nargs="?")


def main(args: argparse.Namespace) -> int:
    mean = compute_image_mean(
        args.input_db,
        args.output_file,
        backend=args.backend,
        progress=default_progress("compute_image_mean"),
    )
    for c, value in enumerate(mean[0].reshape(mean.shape[1], -1).mean(axis=1)):
        print(f"mean_value channel [{c}]: {value:g}")
    if args.output_file:
        print(f"wrote {args.output_file}")
    return 0
