"""Caffe's ``debug_info`` lines (Net::ForwardDebugInfo, BackwardDebugInfo, Backward).

With ``debug_info: true`` Caffe logs, after each layer's Forward, the mean absolute value
(``asum / count``, in float) of every top blob and param blob; after each Backward of a layer
that needs one, that of every bottom diff it propagates to and every param diff it computes;
and after a whole-net Backward (a solver's ForwardBackward) the L1 and L2 norms of all
learnable params at ERROR. Values print as Caffe streams a float: 6 significant digits.
Caffe's UpdateDebugInfo is never called by Caffe 1.0, so no ``[Update]`` lines.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .net import Net

log = logging.getLogger("torchcaffe.solver")


def _mean_abs(t: torch.Tensor) -> float:
    """Blob::asum_data() / count() in float32, as Caffe computes it."""
    t = t.detach().float()
    return float(t.abs().sum() / t.numel())


def log_forward(net: Net, i: int) -> None:
    """Net::ForwardDebugInfo for layer ``i``: its tops, then its params (by ParamSpec name,
    else index)."""
    step = net._net.steps[i]
    device = net._device
    for name in step.tops:
        value = _mean_abs(net._blob_of[name].data_at(device))
        shown = net._pycaffe_names[net._blob_index[name]]  # Caffe's "(automatic)"
        log.info("    [Forward] Layer %s, top blob %s data: %g", step.name, shown, value)
    view = net._layer_views[i]
    specs = getattr(view.module, "layer_param", None)
    for k, blob in enumerate(view.blobs):
        shown = specs.param[k].name if specs is not None and k < len(specs.param) else ""
        value = _mean_abs(blob.data_at(device))
        log.info("    [Forward] Layer %s, param blob %s data: %g", step.name, shown or k, value)


def log_backward(net: Net, i: int) -> None:
    """Net::BackwardDebugInfo for layer ``i`` (one that needs backward): the bottom diffs it
    propagates to, then the diffs of the params it learns (lr_mult != 0), by index."""
    step = net._net.steps[i]
    device = net._device
    for name, need in zip(step.bottoms, step.bottom_need_backward):
        if need:
            value = _mean_abs(net._blob_of[name].diff_at(device))
            log.info("    [Backward] Layer %s, bottom blob %s diff: %g", step.name, name, value)
    for k, (blob, need) in enumerate(zip(net._layer_views[i].blobs, step.param_need_backward)):
        if need:
            value = _mean_abs(blob.diff_at(device))
            log.info("    [Backward] Layer %s, param blob %d diff: %g", step.name, k, value)


def log_param_norms(net: Net) -> None:
    """Net::Backward's closing line: L1 and L2 norms of every learnable param's data and
    diff, summed in float, logged at ERROR as Caffe does."""
    device = net._device
    sums = torch.zeros(4)
    for blob in net._param_blob_of.values():
        data, diff = blob.data_at(device).detach().float(), blob.diff_at(device).detach().float()
        parts = [data.abs().sum(), diff.abs().sum(), data.square().sum(), diff.square().sum()]
        sums += torch.stack(parts).cpu()
    l1_data, l1_diff, sq_data, sq_diff = sums.tolist()
    log.error(
        "    [Backward] All net params (data, diff): L1 norm = (%g, %g); L2 norm = (%g, %g)",
        l1_data,
        l1_diff,
        float(torch.tensor(sq_data).sqrt()),
        float(torch.tensor(sq_diff).sqrt()),
    )
