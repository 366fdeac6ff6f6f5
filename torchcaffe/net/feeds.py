"""Feeding tensors in place of Caffe's data layers (a pure proto transform).

A train/val prototxt starts with layers that read a database (Data, ImageData, HDF5Data, ...).
A torch user usually brings their own DataLoader; given the shapes of a data layer's tops,
``feed_data_layers`` turns that layer into an ``Input`` layer with those shapes, so the rest of
the net builds and ``net(data=x, label=y)`` takes the tensors. Rules (include/exclude, phase)
are kept, so the same prototxt still builds in both phases.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..proto import caffe_pb2

# Caffe types whose tops come from a file or database rather than from bottoms.
SOURCE_LAYER_TYPES = frozenset(
    {
        "Data",
        "ImageData",
        "HDF5Data",
        "AnnotatedData",
        "WindowData",
        "MemoryData",
        "VideoData",
        "DummyData",
        "DenseImageData",
    }
)


def feed_data_layers(
    net: caffe_pb2.NetParameter, shapes: Mapping[str, Sequence[int]]
) -> caffe_pb2.NetParameter:
    """A copy of ``net`` where every source layer whose tops all have ``shapes`` is an Input."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    for lp in out.layer:
        if lp.type not in SOURCE_LAYER_TYPES or not lp.top:
            continue
        if not all(top in shapes for top in lp.top):
            continue
        fed = caffe_pb2.LayerParameter(name=lp.name, type="Input", top=list(lp.top))
        fed.include.extend(lp.include)
        fed.exclude.extend(lp.exclude)
        if lp.HasField("phase"):
            fed.phase = lp.phase
        for top in lp.top:
            fed.input_param.shape.add().dim.extend(int(d) for d in shapes[top])
        lp.CopyFrom(fed)
    return out


def partly_fed_hint(net: caffe_pb2.NetParameter, names: Sequence[str]) -> str | None:
    """Why ``names`` fed no layer, where they are some of a source layer's tops: a data
    layer becomes an Input only when every one of its tops has a shape."""
    for lp in net.layer:
        if lp.type in SOURCE_LAYER_TYPES and set(names) & set(lp.top):
            missing = [t for t in lp.top if t not in names]
            return (
                f"layer '{lp.name}' ({lp.type}) becomes an Input only when input_shapes gives "
                f"every one of its tops: add {missing}"
            )
    return None


def feed_hint(lp: caffe_pb2.LayerParameter) -> str | None:
    """What to tell a user whose net starts with a source layer we cannot run."""
    if lp.type not in SOURCE_LAYER_TYPES:
        return None
    tops = ", ".join(f"'{t}': (N, ...)" for t in lp.top)
    return (
        f"{lp.type} is not implemented here; feed tensors instead: "
        f"torchcaffe.load(..., input_shapes={{{tops}}}) turns this layer into an Input"
    )
