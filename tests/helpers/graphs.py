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


# dynamo before torch 2.13 returns every intermediate of a Function's forward after its
# outputs, in the same tuple
_RETURNS_INTERMEDIATES = torch.torch_version.TorchVersion(torch.__version__) < "2.13"


def _written_in_place(node: object) -> bool:
    """Is ``node`` an FX node whose op writes its result in place (``x.mul_(y)``) or into an
    ``out=`` tensor?"""
    if not isinstance(node, torch.fx.Node) or node.op not in ("call_method", "call_function"):
        return False
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return "out" in node.kwargs or (name.endswith("_") and not name.startswith("_"))


def _returns_its_source(node: object) -> bool:
    """Is ``node`` a ``.to()`` that changes neither dtype nor device (so it returns its
    source tensor itself), or dynamo's ``view_as`` of one?"""
    if not isinstance(node, torch.fx.Node) or node.op != "call_method":
        return False
    if node.target == "view_as":
        return _returns_its_source(node.args[0])
    if node.target != "to" or not isinstance(node.args[0], torch.fx.Node):
        return False
    value, source = node.meta.get("example_value"), node.args[0].meta.get("example_value")
    if not (isinstance(value, torch.Tensor) and isinstance(source, torch.Tensor)):
        return False
    return value.dtype == source.dtype and value.device == source.device


def functions_returning_writes(graphs: list[torch.fx.GraphModule]) -> list[str]:
    """The autograd.Function forwards in dynamo's ``graphs`` (their ``fwd_body`` subgraphs)
    that return a tensor an in-place or ``out=`` op wrote, or a tensor of their own forward
    through a same-dtype ``.to()``. Torch 2.11's dynamo gave such a Function no gradient
    in the compiled backward, silently (LRN's ``mul_``; SoftmaxWithLoss's ``.to()``)."""
    found = []
    for gm in graphs:
        for name, sub in gm.named_modules():
            if not (name.startswith("fwd_body") and isinstance(sub, torch.fx.GraphModule)):
                continue
            (output,) = [n for n in sub.graph.nodes if n.op == "output"]
            returned: list = []
            torch.fx.node.map_arg(output.args[0][0], returned.append)
            if _RETURNS_INTERMEDIATES:  # read only what nothing in the forward reads again
                returned = [n for n in returned if set(n.users) == {output}]
            found += [
                f"{name}: {node.format_node()}"
                for node in returned
                if _written_in_place(node) or _returns_its_source(node)
            ]
    return found
