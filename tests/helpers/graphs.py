"""What torch.compile's graphs of a net call, read from dynamo's FX graphs (no inductor)."""

from __future__ import annotations

import torch


def traced_calls(net: torch.nn.Module, grad: bool = False, **inputs: torch.Tensor) -> list:
    """The ``call_function`` nodes of dynamo's graphs of ``net(**inputs)`` (one graph:
    fullgraph), traced with autograd on or off (``grad``)."""
    graphs: list[torch.fx.GraphModule] = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        torch.compile(net, backend=record, fullgraph=True)(**inputs)
    return [node for gm in graphs for node in gm.graph.nodes if node.op == "call_function"]


def calls_of(net: torch.nn.Module, target: str, grad: bool = False, **inputs: torch.Tensor) -> int:
    """How many times dynamo's graphs of ``net(**inputs)`` call the op named ``target``
    (``str`` of an FX node's target, e.g. "torchcaffe.cached_conv2d.default")."""
    return sum(str(node.target) == target for node in traced_calls(net, grad, **inputs))
