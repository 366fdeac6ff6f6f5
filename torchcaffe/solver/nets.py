"""The solver's train and test nets (Caffe's InitTrainNet / InitTestNets).

File names in a solver (``net``, ``train_net``, ``test_net``, ``weights``) are opened relative
to the working directory, as Caffe opens them, and not relative to the solver file: the data
sources inside the nets are resolved that way too, so a half-relocated setup would only fail
later. A missing file is reported with the solver file, the field, and a hint when the name
does exist next to the solver file.

NetState precedence, as Caffe: the phase default, then the net's own ``state``, then the
solver's ``train_state`` / ``test_state``.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

from ..errors import PartialWeightsWarning
from ..formats.prototxt import read_net
from ..proto import caffe_pb2
from ..pycaffe.net import Net
from .config import field_error

log = logging.getLogger("torchcaffe.solver")


def resolve(name: str, field: str, solver_path: str | None) -> str:
    """``name`` as Caffe opens it (relative to cwd), or a SolverError naming the field."""
    if os.path.exists(name):
        return name
    hint = None
    if solver_path and not os.path.isabs(name):
        beside = os.path.join(os.path.dirname(os.path.abspath(solver_path)), name)
        if os.path.exists(beside):
            hint = (
                f"it exists next to the solver file; Caffe resolves solver paths against "
                f"the working directory, so run from {os.path.dirname(beside)}"
            )
    raise field_error(
        solver_path,
        field,
        f"file {name!r} not found (relative to the working directory {os.getcwd()})",
        hint=hint,
    )


def _net(
    source: str | caffe_pb2.NetParameter,
    default_phase: int,
    override: caffe_pb2.NetState | None,
    options: dict[str, Any],
) -> Net:
    net_param = read_net(source) if isinstance(source, str) else source
    state = caffe_pb2.NetState(phase=caffe_pb2.Phase.Name(default_phase))
    state.MergeFrom(net_param.state)
    if override is not None:
        state.MergeFrom(override)
    return Net(source, phase=state.phase, level=state.level, stages=list(state.stage), **options)


def load_weights(net: Net, param: caffe_pb2.SolverParameter, solver_path: str | None) -> None:
    """The solver's ``weights`` entries (each a comma-separated list), in order. Of several
    files, each fills what it holds: the layers none of them fills are named once, at the end
    (not, per file, those that a later file fills)."""
    paths = [
        resolve(name.strip(), "weights", solver_path)
        for entry in param.weights
        for name in entry.split(",")
    ]
    if len(paths) <= 1:
        for path in paths:
            log.info("Finetuning from %s", path)  # Caffe's LoadNetWeights, per net and file
            net.copy_from(path)
        return
    filled: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PartialWeightsWarning)
        for path in paths:
            log.info("Finetuning from %s", path)
            filled.update(net._copy_from(path))
    tnet = net.module
    layers = [(s.name, tnet.module_of(s).param_blobs()) for s in tnet.steps]
    written = {id(b) for name, blobs in layers if name in filled for b in blobs}  # shared too
    unfilled = [name for name, blobs in layers if any(id(b) not in written for b in blobs)]
    if unfilled:
        warnings.warn(
            f"{len(unfilled)} layers with params got no weights from any of {paths} and keep "
            f"their initial (filler) values: {', '.join(map(repr, unfilled[:20]))}"
            + (f" and {len(unfilled) - 20} more" if len(unfilled) > 20 else ""),
            PartialWeightsWarning,
            stacklevel=2,
        )


def build_train_net(
    param: caffe_pb2.SolverParameter, solver_path: str | None, **options: Any
) -> Net:
    if param.HasField("train_net_param"):
        source: str | caffe_pb2.NetParameter = param.train_net_param
    elif param.HasField("train_net"):
        source = resolve(param.train_net, "train_net", solver_path)
    elif param.HasField("net_param"):
        source = param.net_param
    else:
        source = resolve(param.net, "net", solver_path)
    net = _net(source, caffe_pb2.TRAIN, param.train_state, options)
    load_weights(net, param, solver_path)
    return net


def build_test_nets(
    param: caffe_pb2.SolverParameter, solver_path: str | None, **options: Any
) -> list[Net]:
    sources: list[str | caffe_pb2.NetParameter] = list(param.test_net_param)
    sources += [resolve(n, "test_net", solver_path) for n in param.test_net]
    remaining = len(param.test_iter) - len(sources)
    if param.HasField("net_param"):
        sources += [param.net_param] * remaining
    elif param.HasField("net"):
        sources += [resolve(param.net, "net", solver_path)] * remaining
    nets = []
    for i, source in enumerate(sources):
        state = param.test_state[i] if param.test_state else None
        net = _net(source, caffe_pb2.TEST, state, options)
        load_weights(net, param, solver_path)
        nets.append(net)
    return nets
