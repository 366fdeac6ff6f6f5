"""Caffe's dataset tools as functions: convert_imageset and compute_image_mean.

``convert_imageset`` writes what tools/convert_imageset.cpp writes: keys ``%08d_<name>`` in
list order, raw Datums (CVMatToDatum) or, with an encoding, the image file's own bytes when no
resize or channel change is needed and OpenCV's ``imencode`` output otherwise. Unreadable
images are skipped with a warning, as Caffe does. The database is built beside its target and
renamed into place at the end (``db.DBWriter``).

``compute_image_mean`` sums every record in float32, in key order, and divides by the count,
as tools/compute_image_mean.cpp does, into a 1xCxHxW BlobProto.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import numpy as np

from ..errors import DataError
from ..formats.binaryproto import write_blob_proto
from ..proto import caffe_pb2 as pb
from . import cv
from .datum import datum_to_array, encoded_datum, image_to_datum, parse_datum
from .db import DBWriter, open_db
from .listfile import read_list
from .rng import CaffeRNG

log = logging.getLogger("torchcaffe.data")


def _match_ext(filename: str, encoding: str) -> bool:
    """io.cpp matchExt: the file's extension is the encoding (jpeg counts as jpg)."""
    dot = filename.rfind(".")
    ext = (filename[dot + 1 :] if dot >= 0 else filename).lower()
    encoding = encoding.lower()
    return ext == encoding or (encoding == "jpg" and ext == "jpeg")


def image_datum(
    filename: str,
    label: int,
    *,
    resize_height: int = 0,
    resize_width: int = 0,
    is_color: bool = True,
    encoding: str = "",
) -> pb.Datum | None:
    """io.cpp ReadImageToDatum; None when the image cannot be read (Caffe skips it)."""
    flag = cv.IMREAD_COLOR if is_color else cv.IMREAD_GRAYSCALE
    try:
        img = cv.read(filename, flag)
    except DataError:
        log.error("Could not open or find file %s", filename)  # io.cpp's words, grepped for
        return None
    if resize_height > 0 and resize_width > 0:
        img = cv.resize(img, resize_height, resize_width)
    if encoding:
        channels = 1 if img.ndim == 2 else img.shape[2]
        if (
            (channels == 3) == is_color
            and not resize_height
            and not resize_width
            and _match_ext(filename, encoding)
        ):
            with open(filename, "rb") as f:
                return encoded_datum(f.read(), label)
        return encoded_datum(cv.encode(img, encoding, source=filename), label)
    return image_to_datum(img, label)


def convert_imageset(
    root_folder: str,
    list_file: str,
    db_name: str,
    *,
    resize_height: int = 0,
    resize_width: int = 0,
    shuffle: bool = False,
    gray: bool = False,
    encoded: bool = False,
    encode_type: str = "",
    check_size: bool = False,
    backend: str = "lmdb",
    progress: Callable[[Iterable, int], Iterable] | None = None,
) -> int:
    """Write the images of ``list_file`` (``name label`` lines) into a new database; returns
    the number of records written."""
    lines = read_list(list_file, what="list file", keep_empty=True, allow_empty=True)
    if shuffle:
        log.info("Shuffling data")
        CaffeRNG().shuffle(lines)
    log.info("A total of %d images.", len(lines))
    if encode_type and not encoded:
        log.info("encode_type specified, assuming encoded=true.")
    resize_height, resize_width = max(0, resize_height), max(0, resize_width)
    if check_size and (encoded or encode_type):
        # Caffe compares data sizes against channels*height*width, which encoded datums
        # leave at 0: its tool aborts at the second image. Say so before writing anything.
        raise DataError(
            "check_size cannot be combined with encoded images",
            path=list_file,
            hint="drop -check_size, or write raw datums (no -encoded / -encode_type)",
        )
    count, data_size = 0, None
    with DBWriter(db_name, backend) as db:
        items: Iterable = enumerate(lines)
        if progress is not None:
            items = progress(items, len(lines))
        for line_id, (name, label) in items:
            enc = encode_type
            if encoded and not enc:
                dot = name.rfind(".")
                if dot < 0:
                    log.warning("failed to guess the encoding of %r", name)
                enc = name[dot + 1 :].lower()
            datum = image_datum(
                root_folder + name,
                label,
                resize_height=resize_height,
                resize_width=resize_width,
                is_color=not gray,
                encoding=enc,
            )
            if datum is None:
                continue
            if check_size:
                size = datum.channels * datum.height * datum.width
                if data_size is None:
                    data_size = size
                elif len(datum.data) != data_size:
                    raise DataError(
                        f"incorrect data field size for {name!r} (check_size)",
                        path=list_file,
                        expected=data_size,
                        got=len(datum.data),
                    )
            # the name's bytes as the list file has them (Caffe's keys are bytes)
            key = f"{line_id:08d}_{name}".encode("utf-8", "surrogateescape")
            db.put(key, datum.SerializeToString())
            count += 1
            if count % 1000 == 0:
                log.info("Processed %d files.", count)
    if count % 1000 != 0:
        log.info("Processed %d files.", count)
    return count


def compute_image_mean(
    db_path: str,
    mean_file: str | None = None,
    *,
    backend: str = "lmdb",
    progress: Callable[[Iterable, int], Iterable] | None = None,
) -> np.ndarray:
    """The mean record of a database (1xCxHxW float32); written to ``mean_file`` if given.
    Progress goes to the ``torchcaffe.data`` logger in the words of Caffe's tool."""
    with open_db(db_path, backend) as db:
        for key, value in db.items():  # the tool reads the first record before its loop
            if parse_datum(value, source=db_path, key=key).encoded:
                log.info("Decoding Datum")
            break
        log.info("Starting iteration")
        items: Iterable = db.items()
        if progress is not None:
            items = progress(items, len(db))
        total: np.ndarray | None = None
        count = 0
        for key, value in items:
            arr = datum_to_array(parse_datum(value, source=db_path, key=key), source=db_path)
            if total is None:
                total = np.zeros(arr.shape, np.float32)
            if arr.shape != total.shape:
                raise DataError(
                    f"record {key!r} differs in size from the first record",
                    path=db_path,
                    expected=total.shape,
                    got=arr.shape,
                )
            total += arr
            count += 1
            if count % 10000 == 0:
                log.info("Processed %d files.", count)
    if total is None:
        raise DataError("the database holds no records", path=db_path)
    if count % 10000 != 0:
        log.info("Processed %d files.", count)
    mean = (total / np.float32(count)).astype(np.float32)[None]
    if mean_file is not None:
        log.info("Write to %s", mean_file)
        blob = pb.BlobProto(
            num=1, channels=mean.shape[1], height=mean.shape[2], width=mean.shape[3]
        )
        blob.data.extend(mean.ravel().tolist())
        write_blob_proto(blob, mean_file)
    return mean


def default_progress(desc: str) -> Callable[[Iterable, int], Iterable]:
    """A tqdm progress bar on stderr, where stderr is a terminal (a log file redirected from
    it would fill with carriage-return redraws)."""
    from tqdm import tqdm

    def wrap(items: Iterable, total: int) -> Iterable:
        return tqdm(items, desc=desc, total=total, unit="img", leave=False, disable=None)

    return wrap


__all__ = ["compute_image_mean", "convert_imageset", "image_datum"]
