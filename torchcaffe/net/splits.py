"""Implicit Split layers (Caffe's InsertSplits): a pure function on NetParameter.

A top read by several layers (or read once and also weighted as a loss) gets a Split layer
whose tops feed each reader, so that each reader's gradient lands in its own diff and the
Split sums them — the blob names are Caffe's, so golden blob dumps line up.
"""

from __future__ import annotations

from collections import defaultdict

from ..errors import BlobWiringError
from ..proto import caffe_pb2


def split_layer_name(layer_name: str, blob_name: str, blob_idx: int) -> str:
    return f"{blob_name}_{layer_name}_{blob_idx}_split"


def split_blob_name(layer_name: str, blob_name: str, blob_idx: int, split_idx: int) -> str:
    return f"{blob_name}_{layer_name}_{blob_idx}_split_{split_idx}"


def insert_splits(net: caffe_pb2.NetParameter, path: str | None = None) -> caffe_pb2.NetParameter:
    """A copy of ``net`` with Split layers inserted where Caffe inserts them."""
    last_top: dict[str, tuple[int, int]] = {}
    source_of: dict[tuple[int, int], tuple[int, int]] = {}
    readers: dict[tuple[int, int], int] = defaultdict(int)
    loss_weight: dict[tuple[int, int], float] = {}
    for i, layer in enumerate(net.layer):
        for j, blob in enumerate(layer.bottom):
            if blob not in last_top:
                raise BlobWiringError(
                    f"unknown bottom blob '{blob}' (bottom index {j})",
                    path=path,
                    layer=layer.name,
                    layer_type=layer.type,
                    hint="no earlier layer produces it; check the spelling and layer order",
                )
            source_of[(i, j)] = last_top[blob]
            readers[last_top[blob]] += 1
        for j, blob in enumerate(layer.top):
            last_top[blob] = (i, j)
        for j in range(min(len(layer.loss_weight), len(layer.top))):
            top_idx = last_top[layer.top[j]]
            loss_weight[top_idx] = layer.loss_weight[j]
            if loss_weight[top_idx]:
                readers[top_idx] += 1

    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    del out.layer[:]
    next_split: dict[tuple[int, int], int] = defaultdict(int)
    for i, original in enumerate(net.layer):
        layer = out.layer.add()
        layer.CopyFrom(original)
        for j, blob in enumerate(layer.bottom):
            top_idx = source_of[(i, j)]
            if readers[top_idx] > 1:
                src_name = net.layer[top_idx[0]].name
                layer.bottom[j] = split_blob_name(src_name, blob, top_idx[1], next_split[top_idx])
                next_split[top_idx] += 1
        for j, blob in enumerate(layer.top):
            count = readers[(i, j)]
            if count <= 1:
                continue
            weight = loss_weight.get((i, j), 0.0)
            split = out.layer.add()
            split.name = split_layer_name(layer.name, blob, j)
            split.type = "Split"
            split.bottom.append(blob)
            for k in range(count):
                split.top.append(split_blob_name(layer.name, blob, j, k))
                if weight:
                    split.loss_weight.append(weight if k == 0 else 0.0)
            if weight:
                del layer.loss_weight[:]
                next_split[(i, j)] += 1
    return out
