"""The torch face entry point: ``torchcaffe.load(prototxt, caffemodel, phase)``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from .errors import BlobWiringError
from .formats.caffemodel import (
    LayerRecord,
    check_weights_file,
    copy_trained_layers,
    is_hdf5,
    read_weights,
    save_caffemodel,
    save_hdf5,
)
from .formats.prototxt import read_net, source_name
from .formats.user_schema import use_schema
from .net.net import TorchNet
from .net.state import stage_list
from .ops._fill_skip import plan_from_records, skipping_fillers
from .proto import caffe_pb2
from .trust import allow_python_layers as _allow_python

if TYPE_CHECKING:
    import numpy as np
    import torch

PathLike = str | os.PathLike


def load(
    prototxt: PathLike | caffe_pb2.NetParameter,
    caffemodel: PathLike | None = None,
    phase: int | str = "test",
    *,
    level: int = 0,
    stages: Iterable[str] = (),
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    allow_python_layers: bool = False,
    strict: bool = False,
    caffe_proto: PathLike | None = None,
) -> TorchNet:
    """Compile a Caffe net (text prototxt, or a NetParameter) into a torch ``nn.Module``.

    ``caffemodel`` (binary or HDF5) fills the params by layer name, as Caffe does.
    ``input_shapes`` overrides the declared shapes of input blobs; naming the tops of a data
    layer (Data, ImageData, HDF5Data, ...) there turns that layer into an input you feed, which is
    how a train_val net runs before the data layers exist. ``allow_python_layers``
    lets ``type: "Python"`` layers import and run their module (trusted models only).
    ``strict`` makes a caffemodel that leaves param layers unfilled an error (see
    ``load_weights``). ``caffe_proto`` is a fork's own complete caffe.proto: its added
    messages and fields parse, and layers registered for its types read their params from it
    (docs/forks.md).
    """
    stages = stage_list(stages)
    with use_schema(caffe_proto):
        return _load(
            prototxt, caffemodel, phase, level, stages, input_shapes, allow_python_layers, strict
        )


def _load(
    prototxt: PathLike | caffe_pb2.NetParameter,
    caffemodel: PathLike | None,
    phase: int | str,
    level: int,
    stages: Iterable[str],
    input_shapes: Mapping[str, Sequence[int]] | None,
    allow_python_layers: bool,
    strict: bool,
) -> TorchNet:
    if isinstance(prototxt, caffe_pb2.NetParameter):
        from .formats.upgrade import upgrade_net_as_needed

        net_param, path = upgrade_net_as_needed(prototxt), None
    else:
        net_param = read_net(prototxt)
        path = source_name(prototxt)  # inline text is named "<prototxt text>", not quoted
    records, plan = None, None
    if caffemodel is not None:  # scan first: fillers of the blobs it holds need not run
        weights_path = check_weights_file(caffemodel)
        records, plan = _scan_weights(weights_path)
        plan = _unique_layers_only(plan, net_param)
    with _allow_python(allow_python_layers), skipping_fillers(plan):
        try:
            net = TorchNet(
                net_param,
                phase,
                level=level,
                stages=list(stages),
                path=path,
                input_shapes=input_shapes,
            )
        except BlobWiringError as err:
            if not any(layer.blobs for layer in net_param.layer):
                raise
            # weights in the net file: a caffemodel given as the net (its data layers are gone)
            err.hint = (f"{err.hint}; " if err.hint else "") + (
                "this file holds trained weights, as a .caffemodel does: give the net's "
                "(deploy) prototxt as the net and this file as the weights"
            )
            raise err.located() from None
    if caffemodel is not None:
        stream = (
            iter(records)
            if records is not None
            else read_weights(weights_path, names=set(net.layer_names))
        )
        copy_trained_layers(net, stream, weights_path, strict=strict)
    return net


def _scan_weights(path: str) -> tuple[list[LayerRecord] | None, dict[str, frozenset[int]]]:
    """(records to copy from, or None to read again; the fill plan) of a weights file.

    A binary caffemodel's records are views into its memory map, so they are kept for the copy
    (one walk over the file); an HDF5 file's records hold copies, so only the plan is kept and
    the file is streamed again while copying (peak memory stays one layer above the net)."""
    if is_hdf5(path):
        return None, _hdf5_plan(path)
    records = list(read_weights(path))
    return records, plan_from_records(records)


def _unique_layers_only(
    plan: dict[str, frozenset[int]], net_param: caffe_pb2.NetParameter
) -> dict[str, frozenset[int]]:
    """The fill plan less the layer names the prototxt gives twice or more: the copy fills one
    of those layers (Caffe's rule: the first from a binary file, the last from HDF5), and the
    others keep their fillers' values."""
    seen: set[str] = set()
    twice: set[str] = set()
    for layer in net_param.layer:
        (twice if layer.name in seen else seen).add(layer.name)
    return {name: held for name, held in plan.items() if name not in twice}


def load_weights(
    net: TorchNet,
    caffemodel: PathLike,
    *,
    strict: bool = False,
    set_diff: Callable[[torch.Tensor, np.ndarray], None] | None = None,
) -> list[str]:
    """Copy trained blobs into ``net`` by layer name; returns the layers filled.

    All or nothing: every record is checked before any param changes. Param layers the file
    does not fill keep their values, as in Caffe (fine-tuning), with a
    ``PartialWeightsWarning`` naming them; ``strict=True`` raises ``WeightsError`` instead.
    ``set_diff``: see ``copy_trained_layers`` (the Caffe face loads stored diffs).
    """
    path = os.fspath(caffemodel)
    records = read_weights(path, names=set(net.layer_names))
    return copy_trained_layers(net, records, path, strict=strict, set_diff=set_diff)


def save_weights(
    net: TorchNet, path: PathLike, *, write_diff: bool = False, hdf5: bool | None = None
) -> None:
    """Write a caffemodel (binary; HDF5 when ``hdf5`` or the name ends in .h5), atomically."""
    path = os.fspath(path)
    if hdf5 is None:
        hdf5 = path.endswith((".h5", ".hdf5"))
    (save_hdf5 if hdf5 else save_caffemodel)(net, path, write_diff=write_diff)


def _hdf5_plan(path: str) -> dict[str, frozenset[int]]:
    """The blob indices an HDF5 caffemodel holds per layer (data/<layer>/<i>), no data read."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            data = f.get("data")
            if data is None:
                return {}  # the copy reports the missing group
            if not isinstance(data, h5py.Group):
                return {}
            return {  # a malformed entry is left to the copy, which names it
                name: frozenset(int(k) for k in g if k.isdigit())
                for name, g in data.items()
                if isinstance(g, h5py.Group)
            }
    except OSError:
        return {}  # the copy reports the unreadable file
