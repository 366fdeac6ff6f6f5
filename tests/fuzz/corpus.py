"""Seed inputs for the fuzzers and the structure-aware mutations of each format."""

from __future__ import annotations

import random
import re

import numpy as np
from google.protobuf import text_format

from torchcaffe.proto import caffe_pb2
from torchcaffe.registry import layer_type_list

from .engine import INTERESTING_INTS, INTERESTING_TEXT, mutate_bytes

NETS = [
    """name: "small"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 8 dim: 7 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 stride: 1
                            weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "norm" type: "LRN" bottom: "pool" top: "norm" lrn_param { local_size: 3 } }
layer { name: "ip" type: "InnerProduct" bottom: "norm" top: "ip"
        inner_product_param { num_output: 5 } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
""",
    """name: "wiring"
layer { name: "a" type: "Input" top: "a" top: "b"
        input_param { shape { dim: 2 dim: 6 dim: 3 } } }
layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" top: "cat" concat_param { axis: 1 } }
layer { name: "slice" type: "Slice" bottom: "cat" top: "s1" top: "s2"
        slice_param { axis: 1 slice_point: 5 } }
layer { name: "sum" type: "Eltwise" bottom: "s1" bottom: "a" top: "sum"
        eltwise_param { operation: SUM coeff: 1 coeff: -1 } }
layer { name: "flat" type: "Flatten" bottom: "sum" top: "flat" }
layer { name: "shape" type: "Reshape" bottom: "s2" top: "r"
        reshape_param { shape { dim: 0 dim: -1 } } }
layer { name: "scale" type: "Scale" bottom: "r" top: "r" scale_param { bias_term: true } }
layer { name: "pad" type: "Pad" bottom: "a" top: "padded"
        pad_param { pad_type: REPLICATE pad_u: 1 pad_l: 2 } }
""",
    """name: "v1"
input: "data"
input_dim: 1 input_dim: 2 input_dim: 6 input_dim: 6
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv"
         convolution_param { num_output: 3 kernel_size: 2 } }
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
layers { name: "pool" type: POOLING bottom: "conv" top: "pool"
         pooling_param { pool: AVE kernel_size: 2 } }
layers { name: "ip" type: INNER_PRODUCT bottom: "pool" top: "ip"
         inner_product_param { num_output: 3 } }
""",
]

_NUMBER = re.compile(rb"(?<=: )-?[0-9][0-9.e+-]*")
_QUOTED = re.compile(rb'"[^"\n]*"')


def mutate_prototxt(rng: random.Random, text: bytes, corpus: list[bytes]) -> tuple[bytes, str]:
    ops = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        op = rng.choice(_TEXT_OPS)
        if op is None:
            text, how = mutate_bytes(rng, text, corpus)
            ops.append(how)
        else:
            text = op(rng, text)
            ops.append(op.__name__)
    return text, "+".join(ops)


def swap_number(rng, text):
    spots = list(_NUMBER.finditer(text))
    if not spots:
        return text
    m = rng.choice(spots)
    return text[: m.start()] + rng.choice(INTERESTING_TEXT).encode() + text[m.end() :]


def swap_name(rng, text):
    """Another quoted name, a non-UTF-8 one or an empty one: wiring cycles and duplicates."""
    spots = list(_QUOTED.finditer(text))
    if not spots:
        return text
    m = rng.choice(spots)
    new = rng.choice(
        [rng.choice(spots).group(0), b'"\xff\xfe"', b'""', b'"x\xc3"', b'"' + b"n" * 300 + b'"']
    )
    return text[: m.start()] + new + text[m.end() :]


def _lines(text):
    return text.split(b"\n")


def duplicate_line(rng, text):
    lines = _lines(text)
    i = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines) + 1), lines[i])
    return b"\n".join(lines)


def delete_line(rng, text):
    lines = _lines(text)
    del lines[rng.randrange(len(lines))]
    return b"\n".join(lines)


def swap_lines(rng, text):
    lines = _lines(text)
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return b"\n".join(lines)


def random_layer(rng, text):
    """A layer of any registered type, wired to random existing blobs (cycles included)."""
    names = [m.group(0)[1:-1] for m in _QUOTED.finditer(text)] or [b"data"]
    kind = rng.choice(layer_type_list())
    bottoms = b" ".join(b'bottom: "%s"' % rng.choice(names) for _ in range(rng.randint(0, 3)))
    tops = b" ".join(b'top: "%s"' % rng.choice(names + [b"new"]) for _ in range(rng.randint(0, 2)))
    layer = b'layer { name: "z%d" type: "%s" %s %s }' % (
        rng.randrange(100),
        kind.encode(),
        bottoms,
        tops,
    )
    lines = _lines(text)
    lines.insert(rng.randrange(len(lines) + 1), layer)
    return b"\n".join(lines)


_TEXT_OPS = [swap_number, swap_name, swap_name, duplicate_line, delete_line, swap_lines]
_TEXT_OPS += [random_layer, random_layer, None]


# -- protobuf messages ------------------------------------------------------------------------
def blob_proto(arr: np.ndarray, legacy: bool = False, double: bool = False) -> caffe_pb2.BlobProto:
    bp = caffe_pb2.BlobProto()
    if legacy:
        bp.num, bp.channels, bp.height, bp.width = (1,) * (4 - arr.ndim) + arr.shape
    else:
        bp.shape.dim.extend(arr.shape)
    (bp.double_data if double else bp.data).extend(arr.ravel().tolist())
    return bp


def absurd_shape(rng: random.Random) -> list[int]:
    n = rng.choice((0, 1, 2, 4, 5, 32, 33, 40))
    return [rng.choice(INTERESTING_INTS + [1, 2, 3, 4, 5]) for _ in range(n)]


def mutate_blob(rng: random.Random, bp: caffe_pb2.BlobProto) -> str:
    op = rng.randrange(7)
    if op == 0:
        bp.ClearField("shape")
        bp.shape.dim.extend(absurd_shape(rng))
        return "absurd_shape"
    if op == 1:
        dims = [rng.choice(INTERESTING_INTS + [1, 2, 3]) for _ in range(4)]
        bp.num, bp.channels, bp.height, bp.width = (_int32(d) for d in dims)
        return "legacy_dims"
    if op == 2:
        if len(bp.shape.dim) >= 2:  # transposed: same count, other shape
            dims = list(bp.shape.dim)
            bp.shape.ClearField("dim")
            bp.shape.dim.extend(dims[::-1])
        return "transpose"
    if op == 3:
        del bp.data[rng.randrange(len(bp.data) + 1) :]
        return "short_data"
    if op == 4:
        bp.data.extend([1.0] * rng.randint(1, 5))
        return "long_data"
    if op == 5:
        bp.double_data.extend([0.5] * rng.choice((len(bp.data), 1, 0)))
        return "double_data"
    bp.diff.extend([2.0] * rng.randint(0, 3))
    return "diff"


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def mutate_net_message(rng: random.Random, net: caffe_pb2.NetParameter, names: list[str]) -> str:
    layers = net.layer if len(net.layer) else net.layers
    if not len(layers):
        return "empty"
    op = rng.randrange(8)
    lp = layers[rng.randrange(len(layers))]
    if op <= 2 and len(lp.blobs):
        return mutate_blob(rng, lp.blobs[rng.randrange(len(lp.blobs))])
    if op == 3:
        lp.name = rng.choice(names + ["other", ""])
        return "rename"
    if op == 4:
        layers.add().CopyFrom(lp)
        return "duplicate_layer"
    if op == 5:
        del layers[rng.randrange(len(layers))]
        return "delete_layer"
    if op == 6 and len(lp.blobs):
        del lp.blobs[rng.randrange(len(lp.blobs))]
        return "drop_blob"
    lp.blobs.add().CopyFrom(blob_proto(np.zeros(rng.choice((1, 5, 20)), np.float32)))
    return "extra_blob"


def rename_bytes(rng: random.Random, data: bytes, names: list[str]) -> bytes:
    """Replace a layer name's bytes in place by non-UTF-8 bytes of the same length."""
    for name in rng.sample(names, len(names)):
        raw = name.encode()
        i = data.find(bytes([len(raw)]) + raw)
        if i >= 0:
            junk = bytes(rng.choice((0xFF, 0xFE, 0xC3, 0x80)) for _ in raw)
            return data[: i + 1] + junk + data[i + 1 + len(raw) :]
    return data


def text_net(i: int) -> caffe_pb2.NetParameter:
    return text_format.Parse(NETS[i], caffe_pb2.NetParameter())
