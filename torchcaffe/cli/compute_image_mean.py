"""Compute the mean image of a database of Datums, as Caffe's compute_image_mean.

torchcaffe compute_image_mean [-backend=lmdb] INPUT_DB [OUTPUT_FILE]
"""

from __future__ import annotations

import argparse

import numpy as np

from ..data.tools import compute_image_mean, default_progress, log
from ..glog import on_stderr
from .flags import add_flag


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_flag(p, "backend", "lmdb", "the backend {lmdb, leveldb} of the input database")
    p.add_argument("input_db")
    p.add_argument("output_file", nargs="?")


def main(args: argparse.Namespace) -> int:
    """Caffe's tool: its lines logged to stderr with glog's prefix, nothing on stdout."""
    with on_stderr(log):
        mean = compute_image_mean(
            args.input_db,
            args.output_file,
            backend=args.backend,
            progress=default_progress("compute_image_mean"),
        )
        log.info("Number of channels: %d", mean.shape[1])
        for c, value in enumerate(channel_means(mean)):
            log.info("mean_value channel [%d]: %s", c, format(value, ".6g"))
    return 0


def channel_means(mean: np.ndarray) -> list[np.float32]:
    """Each channel's mean value as the tool computes it: a float sum in storage order, then
    divided by the channel's size in float (what a ``mean_value`` line of a prototxt takes)."""
    planes = mean[0].reshape(mean.shape[1], -1)
    return [np.cumsum(p, dtype=np.float32)[-1] / np.float32(p.size) for p in planes]
