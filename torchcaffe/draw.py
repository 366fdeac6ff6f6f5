"""pycaffe's ``caffe.draw``: a NetParameter as a graphviz picture (PNG, SVG, PDF, ...).

Layers are boxes colored by type (name, type and, for Convolution/Pooling/Deconvolution,
kernel/stride/pad; with ``display_lrm`` the learning-rate multipliers of learning layers),
blobs are octagons (plain nodes where a layer's top is their last mention, as pycaffe's), a
layer's top edges carry pycaffe's edge label (``Batch N``, ``num_output``); in-place layers
draw as an edge back onto their blob, as pycaffe's draw does. Unlike pycaffe's, two layers with
the same label stay two boxes. Needs ``pydot`` (``pip install torchcaffe[draw]``) and
graphviz's ``dot`` program (Debian/Ubuntu: ``apt-get install graphviz``; macOS: ``brew install
graphviz``).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from .errors import DrawError, MissingPackageError, UnsupportedError, UsageError
from .formats.atomic import atomic_write
from .proto import caffe_pb2

# pycaffe's module-level styles (a script may edit them before drawing)
LAYER_STYLE_DEFAULT = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
LAYER_STYLE = LAYER_STYLE_DEFAULT  # the name torchcaffe used first
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": "#90EE90", "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": "#E0E0E0", "style": "filled"}

_LEARNING_TYPES = ("Convolution", "Deconvolution", "InnerProduct")

_DOT_HINT = (
    "install graphviz's `dot` program (Debian/Ubuntu: apt-get install graphviz; "
    "macOS: brew install graphviz)"
)


def _pydot() -> Any:
    try:
        import pydot
    except ImportError as err:  # an ImportError too, as pycaffe's ``import caffe.draw``
        raise MissingPackageError(
            f"caffe.draw needs pydot ({err}); install it with pip install torchcaffe[draw]"
        ) from err
    return pydot


def _geometry(lp: caffe_pb2.LayerParameter) -> str:
    """pycaffe's 'kernel size / stride / pad' text. As draw.py, it reads only kernel_size,
    stride and pad (a convolution's first value, else 1/1/0; a pooling's own fields), so a
    layer set by kernel_h/kernel_w reads 'kernel size: 1' (convolution) or '0' (pooling)."""

    def first(values: Any, default: int) -> int:
        return int(values[0]) if len(values) else default

    if lp.type in ("Convolution", "Deconvolution"):
        cp = lp.convolution_param
        kernel, stride, pad = first(cp.kernel_size, 1), first(cp.stride, 1), first(cp.pad, 0)
    elif lp.type == "Pooling":
        pp = lp.pooling_param
        kernel, stride, pad = pp.kernel_size, pp.stride, pp.pad
    else:
        return ""
    return f"kernel size: {kernel}\\nstride: {stride}\\npad: {pad}"


def get_pooling_types_dict() -> dict[int, str]:
    """PoolingParameter.PoolMethod numbers to their names (0: 'MAX', ...), as pycaffe's."""
    enum = caffe_pb2.PoolingParameter.PoolMethod.DESCRIPTOR
    return {value.number: value.name for value in enum.values}


def get_edge_label(layer: caffe_pb2.LayerParameter) -> str:
    """pycaffe's label for a layer's top edges: 'Batch N' for Data, ``num_output`` for
    Convolution/Deconvolution/InnerProduct, else '""' (graphviz's empty string)."""
    if layer.type == "Data":
        return f"Batch {layer.data_param.batch_size}"
    if layer.type in ("Convolution", "Deconvolution"):
        return str(layer.convolution_param.num_output)
    if layer.type == "InnerProduct":
        return str(layer.inner_product_param.num_output)
    return '""'


def get_layer_lr_mult(layer: caffe_pb2.LayerParameter) -> tuple[float, float]:
    """The (weights, bias) learning-rate multipliers of a Convolution, Deconvolution or
    InnerProduct layer; an absent ``param`` spec counts 1.0, as in Caffe. Other layers and more
    than two specs are a ValueError (DrawError), as in pycaffe."""
    if layer.type not in _LEARNING_TYPES:
        raise DrawError(
            "layers of this type do not have a learning rate multiplier",
            layer=layer.name,
            layer_type=layer.type,
            expected=" or ".join(_LEARNING_TYPES),
        )
    if len(layer.param) > 2:
        raise DrawError(
            "could not parse the learning rate multiplier",
            layer=layer.name,
            layer_type=layer.type,
            expected="at most 2 param specs",
            got=len(layer.param),
        )
    mults = [float(spec.lr_mult) for spec in layer.param] + [1.0, 1.0]
    return mults[0], mults[1]


def choose_color_by_layertype(layertype: str) -> str:
    """pycaffe's box color for a layer type (conv red, pooling orange, inner product purple)."""
    if layertype in ("Convolution", "Deconvolution"):
        return "#FF5050"
    if layertype == "Pooling":
        return "#FF9900"
    if layertype == "InnerProduct":
        return "#CC33FF"
    return "#6495ED"


def get_layer_label(
    layer: caffe_pb2.LayerParameter, rankdir: str, display_lrm: bool = False
) -> str:
    """The box text: name, type, geometry and, with ``display_lrm``, the learning-rate
    multipliers of learning layers ('lr mult: 1.0, 2.0'; left out when both are 0), on
    separate lines (one line for TB/BT). In double quotes, as pycaffe returns it (dot reads
    the colons in an unquoted label as port separators)."""
    sep = " " if rankdir in ("TB", "BT") else "\\n"
    kind = layer.type
    if kind == "Pooling":  # pycaffe's "(Pooling MAX)"
        kind += " " + caffe_pb2.PoolingParameter.PoolMethod.Name(layer.pooling_param.pool)
    parts = [layer.name, f"({kind})"]
    geometry = _geometry(layer)
    if geometry:
        parts.append(geometry.replace("\\n", sep))
    if display_lrm and layer.type in _LEARNING_TYPES:
        weights, bias = get_layer_lr_mult(layer)
        if weights or bias:
            parts.append(f"lr mult: {weights:.1f}, {bias:.1f}")
    return '"' + sep.join(parts) + '"'


def _in_phase(lp: caffe_pb2.LayerParameter, phase: int | None) -> bool:
    """pycaffe draw.py's filter: only the rules' ``phase`` counts (an unset one reads TRAIN,
    its default); stages and levels are ignored. Include and exclude together is an error."""
    if phase is None:
        return True
    if lp.include and lp.exclude:
        raise DrawError(
            "specify either include rules or exclude rules, not both",
            layer=lp.name,
            layer_type=lp.type,
        )
    if lp.include:
        return any(rule.phase == phase for rule in lp.include)
    return not any(rule.phase == phase for rule in lp.exclude)


def get_pydot_graph(
    caffe_net: caffe_pb2.NetParameter,
    rankdir: str,
    label_edges: bool = True,
    phase: int | None = None,
    display_lrm: bool = False,
) -> Any:
    """The net as a ``pydot.Dot`` graph (layers of ``phase`` only, when given; learning-rate
    multipliers in the labels with ``display_lrm``)."""
    pydot = _pydot()
    graph = pydot.Dot(
        caffe_net.name if caffe_net.name else "Net", graph_type="digraph", rankdir=rankdir
    )
    # One ordered table, as pycaffe's: a node keeps the place of its first mention and the
    # style of its last; a blob drawn as a bottom is an octagon, one last drawn as a top
    # (the net's outputs, an in-place layer's blob no later layer reads) a plain node.
    nodes: dict[str, Any] = {}
    edges: list[tuple[str, str, str]] = []
    for index, lp in enumerate(caffe_net.layer):
        if not _in_phase(lp, phase):
            continue
        node_name = f"{lp.name}_{lp.type}_{index}"
        if ":" in node_name:  # quoted, or dot reads 'a:b' as node a, port b (pycaffe's are)
            node_name = f'"{node_name}"'
        in_place = len(lp.bottom) == 1 and list(lp.top) == list(lp.bottom)
        style = NEURON_LAYER_STYLE
        if not in_place:  # colored by type, as pycaffe's boxes
            style = {**LAYER_STYLE_DEFAULT, "fillcolor": choose_color_by_layertype(lp.type)}
        label = get_layer_label(lp, rankdir, display_lrm)
        nodes[node_name] = pydot.Node(node_name, label=label, **style)
        for bottom in lp.bottom:
            nodes[f"{bottom}_blob"] = pydot.Node(f"{bottom}_blob", label=bottom, **BLOB_STYLE)
            edges.append((f"{bottom}_blob", node_name, ""))
        # pycaffe labels a layer's top edges (get_edge_label: 'Batch N', num_output)
        top_label = get_edge_label(lp) if label_edges else ""
        for top in lp.top:
            nodes[f"{top}_blob"] = pydot.Node(f"{top}_blob", label=top)
            edges.append((node_name, f"{top}_blob", "" if top_label == '""' else top_label))
    for node in nodes.values():
        graph.add_node(node)
    for src, dst, label in edges:
        graph.add_edge(pydot.Edge(src, dst, label=label) if label else pydot.Edge(src, dst))
    return graph


def draw_net(
    caffe_net: caffe_pb2.NetParameter,
    rankdir: str,
    ext: str = "png",
    phase: int | None = None,
    display_lrm: bool = False,
) -> bytes:
    """The picture's bytes in format ``ext`` (png, svg, pdf, ... as graphviz names them);
    ``raw`` is the dot text itself, which pycaffe's draw_net_to_file documents for '.raw'
    (no graphviz needed)."""
    if ext != "raw" and shutil.which("dot") is None:
        raise UnsupportedError(f"caffe.draw cannot find graphviz's `dot` program; {_DOT_HINT}")
    graph = get_pydot_graph(caffe_net, rankdir, phase=phase, display_lrm=display_lrm)
    if ext == "raw":
        return graph.to_string().encode()
    try:
        return bytes(graph.create(format=ext))
    except (AssertionError, OSError):  # pydot's report of dot's failure
        raise UsageError(
            f"graphviz's dot cannot write a {ext!r} file",
            hint="name the output by a format dot knows (.png, .svg, .pdf, ...)",
        ) from None


def draw_net_to_file(
    caffe_net: caffe_pb2.NetParameter,
    filename: str | os.PathLike,
    rankdir: str = "LR",
    phase: int | None = None,
    display_lrm: bool = False,
) -> None:
    """Write the picture to ``filename``; its extension picks the format (atomic write).
    Arguments in pycaffe's order: draw_net.py passes ``display_lrm`` fifth."""
    ext = os.path.splitext(os.fspath(filename))[1][1:] or "png"
    data = draw_net(caffe_net, rankdir, ext, phase, display_lrm)
    with atomic_write(filename, "wb") as f:
        f.write(data)
