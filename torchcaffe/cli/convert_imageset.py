"""Convert a set of images to a LMDB/LevelDB of Datums, as Caffe's convert_imageset.

    torchcaffe convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME

LISTFILE holds ``subfolder1/file1.JPEG 7`` lines. Keys are ``%08d_<name>`` in list order. The
database is written beside DB_NAME and renamed into place at the end: an interrupted run leaves
nothing under DB_NAME.
"""

from __future__ import annotations

import argparse

from ..data.tools import convert_imageset, default_progress, log
from ..glog import on_stderr
from .flags import add_flag


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_flag(p, "gray", False, "when this option is on, treat images as grayscale ones")
    add_flag(p, "shuffle", False, "randomly shuffle the order of images and their labels")
    add_flag(p, "backend", "lmdb", "the backend {lmdb, leveldb} for storing the result")
    add_flag(p, "resize_width", 0, "width images are resized to")
    add_flag(p, "resize_height", 0, "height images are resized to")
    add_flag(
        p,
        "check_size",
        False,
        "when this option is on, check that all the datum have the same size",
    )
    add_flag(p, "encoded", False, "when this option is on, the encoded image will be save in datum")
    add_flag(
        p, "encode_type", "", "optional: what type should we encode the image as ('png','jpg',...)"
    )
    p.add_argument("root_folder")
    p.add_argument("list_file")
    p.add_argument("db_name")


def main(args: argparse.Namespace) -> int:
    """Caffe's tool: its lines logged to stderr with glog's prefix, nothing on stdout."""
    with on_stderr(log):
        convert_imageset(
            args.root_folder,
            args.list_file,
            args.db_name,
            resize_height=args.resize_height,
            resize_width=args.resize_width,
            shuffle=args.shuffle,
            gray=args.gray,
            encoded=args.encoded,
            encode_type=args.encode_type,
            check_size=args.check_size,
            backend=args.backend,
            progress=default_progress("convert_imageset"),
        )
    return 0
