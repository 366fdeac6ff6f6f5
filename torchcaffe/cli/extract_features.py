"""Extract blobs of a trained net into databases of Datums, as Caffe's extract_features.

    torchcaffe extract_features PRETRAINED.caffemodel NET.prototxt BLOB1[,BLOB2,...]
                                DB1[,DB2,...] NUM_MINI_BATCHES lmdb|leveldb [CPU|GPU] [DEVICE_ID]

The net is built in the TEST phase and run NUM_MINI_BATCHES times (its data layers advance each
time). Each item of each batch of BLOBi becomes one Datum in the new database DBi: ``float_data``
holds the item's values, channels/height/width are the blob's legacy axes (1 past its last), no
label; keys are the running item index as ``%010d``. A database that exists is refused, as
Caffe's NEW mode refuses it; the databases are built beside their names and renamed at the end,
so a failed run leaves nothing.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from ..data.db import BACKENDS, DBWriter, backend_name
from ..errors import BlobShapeError, DataError, DeviceError, UnknownNameError, UsageError
from ..formats.prototxt import BINARY_SUFFIXES, TEXT_SUFFIXES
from ..proto import caffe_pb2
from ..pycaffe.net import Net
from .devices import requested_gpus, use_device
from .flags import add_python_layers_flag

REPORT_EVERY = 1000  # Caffe commits and logs every 1000 items per blob


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pretrained_net_param", help="trained weights (caffemodel or HDF5)")
    p.add_argument("feature_extraction_proto_file", help="net prototxt with data layers")
    p.add_argument("extract_feature_blob_names", help="blob name(s), comma-separated")
    p.add_argument("save_feature_dataset_names", help="new database name(s), comma-separated")
    p.add_argument("num_mini_batches", type=int, help="forward passes to run")
    p.add_argument("db_type", help=f"{' or '.join(BACKENDS)}")
    p.add_argument("mode", nargs="?", default="CPU", help="CPU (default) or GPU")
    p.add_argument("device_id", nargs="?", type=int, default=0, help="GPU device id (default 0)")
    add_python_layers_flag(p)


def _log(message: str) -> None:
    print(message, file=sys.stderr)  # Caffe's tool logs these at LOG(ERROR): stderr


def main(args: argparse.Namespace) -> int:
    blob_names = args.extract_feature_blob_names.split(",")
    dataset_names = args.save_feature_dataset_names.split(",")
    if len(blob_names) != len(dataset_names):
        raise UsageError(
            "the number of blob names and dataset names must be equal",
            expected=len(blob_names),
            got=f"{len(dataset_names)} ({args.save_feature_dataset_names!r})",
        )
    if args.num_mini_batches < 0:
        raise UsageError(
            "num_mini_batches must not be negative", expected=">= 0", got=args.num_mini_batches
        )
    backend = backend_name(args.db_type)
    _check_order(args.pretrained_net_param, args.feature_extraction_proto_file)
    _check_targets(dataset_names)
    if args.mode == "GPU":
        if args.device_id < 0:
            raise DeviceError("DEVICE_ID must not be negative", expected=">= 0", got=args.device_id)
        if not torch.cuda.is_available():
            raise DeviceError(
                "GPU mode: CUDA is not available on this machine",
                hint="pass CPU (or leave the mode out) to run on the CPU",
            )
        use_device(requested_gpus(str(args.device_id))[0])
        _log(f"Using GPU\nUsing Device_id={args.device_id}")
    else:  # Caffe's tool: anything but "GPU" runs on the CPU
        use_device(None)
        _log("Using CPU")

    proto = args.feature_extraction_proto_file
    net = Net(proto, phase=caffe_pb2.TEST, allow_python_layers=args.allow_python_layers)
    net.copy_from(args.pretrained_net_param)
    for name in blob_names:
        if name not in net.blobs:
            raise UnknownNameError(
                f"unknown feature blob name {name!r} in the network",
                path=proto,
                hint=f"the net's blobs: {', '.join(net.blobs)}",
            )
    writers: list[DBWriter] = []
    try:
        for name in dataset_names:
            writers.append(DBWriter(name, backend))
        counts = _extract(net, blob_names, writers, args.num_mini_batches)
        _commit_all(writers)
    finally:
        for writer in writers:
            writer.abort()  # does nothing to a committed one
    for name, count in zip(blob_names, counts):
        _log(f"Extracted features of {count} query images for feature blob {name}")
    _log("Successfully extracted the features!")
    return 0


def _check_order(weights: str, proto: str) -> None:
    """Caffe's order puts the weights first; file names that say otherwise are refused."""
    weights_suffix, proto_suffix = (os.path.splitext(p)[1].lower() for p in (weights, proto))
    if weights_suffix in TEXT_SUFFIXES or proto_suffix in BINARY_SUFFIXES | {".h5"}:
        raise UsageError(
            "the weights and the net prototxt look swapped",
            expected="PRETRAINED.caffemodel NET.prototxt",
            got=f"{weights} {proto}",
            hint="Caffe's extract_features takes the weights first, then the prototxt",
        )


def _check_targets(dataset_names: list[str]) -> None:
    """Every database is new and named once, checked before the net is built."""
    seen: set[str] = set()
    for name in dataset_names:
        if not name:
            raise UsageError("an empty database name", expected="a path", got=repr(name))
        path = os.path.abspath(name)
        if path in seen:
            raise UsageError("the same database is named twice", got=name)
        seen.add(path)
        if not os.path.isdir(os.path.dirname(path)):
            raise DataError("the output directory does not exist", path=os.path.dirname(path))
        if os.path.lexists(path):
            raise DataError(
                "the output database already exists",
                path=name,
                hint="remove it or pick another name (Caffe's tool refuses to overwrite it too)",
            )


def _extract(net: Net, blob_names: list[str], writers: list[DBWriter], batches: int) -> list[int]:
    """Run ``batches`` forwards, writing each item of each blob; the items written per blob."""
    _log("Extracting Features")
    counts = [0] * len(blob_names)
    for _ in range(batches):
        net.forward()
        for i, name in enumerate(blob_names):
            blob = net.blobs[name]
            if blob.num_axes > 4:  # Caffe's tool reads the legacy num/channels/height/width
                raise BlobShapeError(
                    f"feature blob {name!r} has more than 4 axes, which Caffe's Datum layout "
                    "(channels, height, width) cannot hold",
                    expected="at most 4 axes",
                    got=blob.shape,
                )
            num = blob.num
            if num == 0:
                raise BlobShapeError(
                    f"feature blob {name!r} holds no items", expected="num > 0", got=blob.shape
                )
            channels, height, width = blob.channels, blob.height, blob.width
            rows = blob.data.astype("float32", copy=False).reshape(num, -1)
            for row in rows:
                datum = caffe_pb2.Datum(channels=channels, height=height, width=width)
                datum.float_data.extend(row.tolist())
                writers[i].put(f"{counts[i]:010d}".encode(), datum.SerializeToString())
                counts[i] += 1
                if counts[i] % REPORT_EVERY == 0:
                    _log(f"Extracted features of {counts[i]} query images for feature blob {name}")
    return counts


def _commit_all(writers: list[DBWriter]) -> None:
    """Move every database to its name, after checking that none appeared meanwhile."""
    for writer in writers:
        if os.path.lexists(writer.path):
            raise DataError("the output database appeared while writing", path=writer.path)
    for writer in writers:
        writer.commit()
