"""Score a trained model, as ``caffe test``: per-batch outputs, then their means.

    torchcaffe test -model NET.prototxt -weights W.caffemodel [-iterations 50] [-gpu ID]
                    [-level N] [-stage A,B] [-allow_python_layers]

The net is built in the TEST phase and run ``-iterations`` times (its data layers advance each
time). Logs Caffe's lines to stderr with glog's prefix, as caffe.cpp does: ``Batch i, name =
value`` for every element of every output, then ``Loss: mean loss`` and ``name = mean`` (with
``(* weight = weighted loss)`` for loss outputs).
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from ..errors import SolverError
from ..glog import on_stderr
from ..proto import caffe_pb2
from ..pycaffe.net import Net
from ..solver.evaluation import weighted_loss
from .devices import requested_gpus, use_device
from .flags import add_net_state_flags, require


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="net prototxt")
    p.add_argument("--weights", required=True, help="caffemodel(s) to score, comma-separated")
    p.add_argument("--iterations", type=int, default=50, help="batches to run")
    p.add_argument("--gpu", default="", help="device id (the first of a list is used)")
    add_net_state_flags(p)


log = logging.getLogger("torchcaffe.caffe")


def main(args: argparse.Namespace) -> int:
    """Caffe's ``test``, its lines logged to stderr with glog's prefix, as caffe.cpp logs."""
    with on_stderr(log):
        return _test(args)


def _test(args: argparse.Namespace) -> int:
    require(args.model, "model", "Need a model definition to score")
    require(args.weights, "weights", "Need model weights to score")
    if args.iterations < 1:
        raise SolverError("-iterations must be positive", expected=">= 1", got=args.iterations)
    gpus = requested_gpus(args.gpu)
    use_device(gpus[0] if gpus else None)
    log.info("Use CPU." if not gpus else f"Use GPU with device ID {gpus[0]}")
    stages = [s for s in args.stage.split(",") if s]
    net = Net(
        args.model,
        phase=caffe_pb2.TEST,
        level=args.level,
        stages=stages,
        allow_python_layers=args.allow_python_layers,
    )
    for name in args.weights.split(","):
        net.copy_from(name.strip())
    log.info(f"Running for {args.iterations} iterations.")
    weights = net.blob_loss_weights
    sums: dict[str, np.ndarray] = {}
    loss = np.float32(0.0)  # caffe.cpp keeps the loss and the sums in float
    for i in range(args.iterations):
        net.forward()
        loss += np.float32(weighted_loss(net))
        for name in net.outputs:
            scores = net.blobs[name].data.astype(np.float32).ravel()
            for score in scores:
                log.info(f"Batch {i}, {name} = {score:g}")
            sums[name] = sums[name] + scores if name in sums else scores.copy()
    log.info(f"Loss: {loss / np.float32(args.iterations):g}")
    for name, total in sums.items():
        w = weights.get(name, 0.0)
        for score in total / np.float32(args.iterations):
            extra = f" (* {w:g} = {w * score:g} loss)" if w else ""
            log.info(f"{name} = {score:g}{extra}")
    return 0
