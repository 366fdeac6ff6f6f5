"""Caffe's Solver::Test: evaluate a test net with the train net's current params.

Every output blob is summed element-wise over ``test_iter`` forwards and averaged; with
``test_compute_loss`` the weighted loss is averaged too. Sums and means are float32, as
Caffe's ``vector<Dtype>``: the logged score of a long test is Caffe's to the last digit.
Results are logged as Caffe logs them ("Test net output #k: name = value (* weight =
loss)") and returned by name.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from ..pycaffe.net import Net

if TYPE_CHECKING:
    from .solver import Solver

log = logging.getLogger("torchcaffe.solver")


def run_test(solver: Solver, index: int) -> OrderedDict[str, np.ndarray]:
    from .solver import NONE, SNAPSHOT, STOP

    log.info("Iteration %d, Testing net (#%d)", solver.iter, index)
    net = solver.test_nets[index]
    net.share_with(solver.net)
    iters = solver.param.test_iter[index]
    sums: OrderedDict[str, np.ndarray] = OrderedDict()
    loss = np.float32(0.0)
    for _ in range(iters):
        request = solver._requested()
        while request != NONE:
            if request == SNAPSHOT:
                solver.snapshot()
            elif request == STOP:
                solver.requested_early_exit = True
            request = solver._requested()
        if solver.requested_early_exit:
            log.info("Test interrupted.")
            return OrderedDict()
        net.forward()
        if solver.param.test_compute_loss:
            loss += np.float32(weighted_loss(net))
        for name in net.outputs:
            value = net.blobs[name].data.astype(np.float32).ravel()
            sums[name] = sums[name] + value if name in sums else value.copy()
    if solver.param.test_compute_loss:
        log.info("Test loss: %g", loss / np.float32(iters))
    means = OrderedDict((n, v / np.float32(iters)) for n, v in sums.items())
    log_outputs(net, "Test", means)
    return means


def weighted_loss(net: Net) -> float:
    """Caffe's loss of a forward: sum over loss blobs of weight * sum(blob) (every automatic
    top counts, though ``net.blobs`` shows pycaffe's one "(automatic)")."""
    blobs = net._blobs
    return sum(w * float(blobs[i].data.sum()) for i, w in enumerate(net._blob_loss_weights) if w)


def log_outputs(net: Net, kind: str, values: dict[str, np.ndarray]) -> None:
    weights = net.blob_loss_weights
    k = 0
    for name, vec in values.items():
        for x in np.ravel(vec):
            w = weights.get(name, 0.0)
            extra = f" (* {w:g} = {w * x:g} loss)" if w else ""
            log.info("    %s net output #%d: %s = %g%s", kind, k, name, x, extra)
            k += 1
