"""pycaffe's ``caffe.draw``: a NetParameter as a graphviz picture (PNG, SVG, PDF, ...).

Layers are boxes (name, type and, for Convolution/Pooling/Deconvolution, kernel/stride/pad),
blobs are octagons; in-place layers draw as an edge back onto their blob, as pycaffe's draw
does. Needs ``pydot`` (``pip install torchcaffe[draw]``) and graphviz's ``dot`` program
(Debian/Ubuntu: ``apt-get install graphviz``; macOS: ``brew install graphviz``).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from .errors import UnsupportedError
from .formats.atomic import atomic_write
from .net.state import state_meets_rule
from .proto import caffe_pb2

LAYER_STYLE = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": "#90EE90", "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": "#E0E0E0", "style": "filled"}

_DOT_HINT = (
    "install graphviz's `dot` program (Debian/Ubuntu: apt-get install graphviz; "
    "macOS: brew install graphviz)"
)


def _pydot() -> Any:
    try:
        import pydot
    except ImportError as err:
        raise UnsupportedError(
            f"caffe.draw needs pydot ({err}); install it with pip install torchcaffe[draw]"
        ) from err
    return pydot


def _geometry(lp: caffe_pb2.LayerParameter) -> str:
    def first(values: Any, default: int) -> int:
        return int(values[0]) if len(values) else default

    if lp.type in ("Convolution", "Deconvolution"):
        cp = lp.convolution_param
        kernel = cp.kernel_h if cp.HasField("kernel_h") else first(cp.kernel_size, 1)
        stride = cp.stride_h if cp.HasField("stride_h") else first(cp.stride, 1)
        pad = cp.pad_h if cp.HasField("pad_h") else first(cp.pad, 0)
        return f"kernel size: {kernel}\\nstride: {stride}\\npad: {pad}"
    if lp.type == "Pooling":
        pp = lp.pooling_param
        pool = caffe_pb2.PoolingParameter.PoolMethod.Name(pp.pool)
        kernel = pp.kernel_h if pp.HasField("kernel_h") else pp.kernel_size
        stride = pp.stride_h if pp.HasField("stride_h") else pp.stride
        pad = pp.pad_h if pp.HasField("pad_h") else pp.pad
        return f"pool: {pool}\\nkernel size: {kernel}\\nstride: {stride}\\npad: {pad}"
    return ""


def get_layer_label(layer: caffe_pb2.LayerParameter, rankdir: str) -> str:
    """The box text: name, type and geometry, on separate lines (one line for LR/RL)."""
    sep = " " if rankdir in ("TB", "BT") else "\\n"
    parts = [layer.name, f"({layer.type})"]
    geometry = _geometry(layer)
    if geometry:
        parts.append(geometry.replace("\\n", sep))
    return sep.join(parts)


def _in_phase(lp: caffe_pb2.LayerParameter, phase: int | None) -> bool:
    if phase is None:
        return True
    state = caffe_pb2.NetState()
    state.phase = phase  # type: ignore[assignment]
    if lp.include:
        return any(state_meets_rule(state, rule) for rule in lp.include)
    return not any(state_meets_rule(state, rule) for rule in lp.exclude)


def get_pydot_graph(
    caffe_net: caffe_pb2.NetParameter,
    rankdir: str,
    label_edges: bool = True,
    phase: int | None = None,
) -> Any:
    """The net as a ``pydot.Dot`` graph (layers of ``phase`` only, when given)."""
    pydot = _pydot()
    graph = pydot.Dot(
        caffe_net.name if caffe_net.name else "Net", graph_type="digraph", rankdir=rankdir
    )
    blob_nodes: dict[str, Any] = {}
    edges: list[tuple[str, str, str]] = []

    def blob(name: str) -> str:
        if name not in blob_nodes:
            blob_nodes[name] = pydot.Node(f"{name}_blob", label=name, **BLOB_STYLE)
        return f"{name}_blob"

    for index, lp in enumerate(caffe_net.layer):
        if not _in_phase(lp, phase):
            continue
        node_name = f"{lp.name}_{lp.type}_{index}"
        in_place = len(lp.bottom) == 1 and list(lp.top) == list(lp.bottom)
        style = NEURON_LAYER_STYLE if in_place else LAYER_STYLE
        graph.add_node(pydot.Node(node_name, label=get_layer_label(lp, rankdir), **style))
        for bottom in lp.bottom:
            edges.append((blob(bottom), node_name, bottom if label_edges else ""))
        for top in lp.top:
            edges.append((node_name, blob(top), top if label_edges and in_place else ""))
    for node in blob_nodes.values():
        graph.add_node(node)
    for src, dst, label in edges:
        graph.add_edge(pydot.Edge(src, dst, label=label) if label else pydot.Edge(src, dst))
    return graph


def draw_net(
    caffe_net: caffe_pb2.NetParameter, rankdir: str, ext: str = "png", phase: int | None = None
) -> bytes:
    """The picture's bytes in format ``ext`` (png, svg, pdf, ... as graphviz names them)."""
    if shutil.which("dot") is None:
        raise UnsupportedError(f"caffe.draw cannot find graphviz's `dot` program; {_DOT_HINT}")
    graph = get_pydot_graph(caffe_net, rankdir, phase=phase)
    return bytes(graph.create(format=ext))


def draw_net_to_file(
    caffe_net: caffe_pb2.NetParameter,
    filename: str | os.PathLike,
    rankdir: str = "LR",
    phase: int | None = None,
) -> None:
    """Write the picture to ``filename``; its extension picks the format (atomic write)."""
    ext = os.path.splitext(os.fspath(filename))[1][1:] or "png"
    data = draw_net(caffe_net, rankdir, ext, phase)
    with atomic_write(filename, "wb") as f:
        f.write(data)
