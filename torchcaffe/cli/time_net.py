"""Benchmark a model's execution time layer by layer, as ``caffe time``.

    torchcaffe time -model NET.prototxt [-iterations 50] [-phase TRAIN|TEST] [-gpu ID]
                    [-level N] [-stage A,B] [-allow_python_layers]

One untimed forward and backward first (allocations, warm-up), then ``-iterations`` rounds of
every layer's forward in order and every layer's backward in reverse, each layer timed on its
own (with a device synchronise on a GPU, as Caffe's CUDA timers). Logs Caffe's report (to
stderr, with glog's prefix): each
iteration's forward-backward time, the average forward and backward time per layer, the
average forward pass, backward pass, forward-backward and the total. Input blobs are left as
Caffe leaves them (zeros): the net is assumed to take no real input.

Caffe's tool calls every layer's Backward even in a net without a loss (a deploy net), so its
parameter gradients are timed; here a net without a loss is built with ``force_backward`` so
that backward runs (it then also computes bottom gradients, which Caffe skips there).
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

from ..errors import LayerParamError, TorchCaffeError
from ..formats.prototxt import read_net
from ..glog import on_stderr
from ..proto import caffe_pb2
from ..pycaffe.net import Net
from .devices import requested_gpus, use_device
from .flags import add_net_state_flags, require


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="net prototxt")
    p.add_argument("--iterations", type=int, default=50, help="timed iterations")
    # caffe.cpp's get_phase_from_flags: an empty -phase (its default) is time's TRAIN
    p.add_argument("--phase", default="", choices=["", "TRAIN", "TEST"], help="net phase")
    p.add_argument("--gpu", default="", help="device id (the first of a list is used)")
    add_net_state_flags(p)


class _Clock:
    """Caffe's Timer, in microseconds. On the CPU it reads boost's microsecond clock, so
    its MicroSeconds are whole and its MilliSeconds truncated to whole milliseconds (the
    per-iteration and total lines print ``18 ms.``); on a GPU, CUDA events' fractional
    times, read after a synchronise."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return time.perf_counter() * 1e6
        return float(time.perf_counter_ns() // 1000)

    def ms(self, start: float, end: float) -> float:
        """Timer::MilliSeconds between two readings."""
        return (end - start) / 1e3 if self.cuda else float((end - start) // 1e3)


log = logging.getLogger("torchcaffe.caffe")


def main(args: argparse.Namespace) -> int:
    """Caffe's ``time``, its lines logged to stderr with glog's prefix, as caffe.cpp logs."""
    with on_stderr(log):
        return _time(args)


def _time(args: argparse.Namespace) -> int:
    require(args.model, "model", "Need a model definition to time")
    if args.iterations < 1:
        raise LayerParamError("-iterations must be positive", expected=">= 1", got=args.iterations)
    gpus = requested_gpus(args.gpu)
    use_device(gpus[0] if gpus else None)
    log.info("Use CPU." if not gpus else f"Use GPU with device ID {gpus[0]}")
    net_param = read_net(args.model)
    options = dict(
        phase=caffe_pb2.Phase.Value(args.phase or "TRAIN"),
        level=args.level,
        stages=[s for s in args.stage.split(",") if s],
        allow_python_layers=args.allow_python_layers,
    )
    try:  # built from the NetParameter (to set force_backward): errors learn the file here
        net = Net(net_param, **options)
        if not any(net._blob_loss_weights) and not net_param.force_backward:
            log.info("The net has no loss: timing backward with force_backward: true.")
            net_param.force_backward = True
            net = Net(net_param, **options)
    except TorchCaffeError as err:
        raise err.located(path=args.model) from None
    last = len(net.layers) - 1
    log.info("Performing Forward")
    log.info(f"Initial loss: {net._forward(0, last):g}")
    log.info("Performing Backward")
    net._backward(last, 0)
    clock = _Clock(net._ensure_device())
    names = list(net._layer_names)
    forward = [0.0] * len(names)
    backward = [0.0] * len(names)
    forward_total = backward_total = 0.0
    log.info("*** Benchmark begins ***")
    log.info(f"Testing for {args.iterations} iterations.")
    start = clock.now()
    for j in range(args.iterations):
        iter_start = clock.now()
        for i in range(len(names)):
            t = clock.now()
            net._forward(i, i)
            forward[i] += clock.now() - t
        backward_start = clock.now()
        forward_total += backward_start - iter_start
        for i in range(last, -1, -1):
            t = clock.now()
            net._backward(i, i)
            backward[i] += clock.now() - t
        end = clock.now()
        backward_total += end - backward_start
        iteration = clock.ms(iter_start, end)
        log.info(f"Iteration: {j + 1} forward-backward time: {iteration:g} ms.")
    n = args.iterations
    log.info("Average time per layer: ")
    for name, f, b in zip(names, forward, backward):
        log.info(f"{name:>10}\tforward: {f / 1e3 / n:g} ms.")
        log.info(f"{name:>10}\tbackward: {b / 1e3 / n:g} ms.")
    total = clock.ms(start, clock.now())  # caffe.cpp stops its total timer here
    log.info(f"Average Forward pass: {forward_total / 1e3 / n:g} ms.")
    log.info(f"Average Backward pass: {backward_total / 1e3 / n:g} ms.")
    log.info(f"Average Forward-Backward: {total / n:g} ms.")
    log.info(f"Total Time: {total:g} ms.")
    log.info("*** Benchmark ends ***")
    return 0
