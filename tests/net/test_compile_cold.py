"""torch.compile of a net that never ran eagerly: its program is built outside dynamo's trace
(``net/untraced_build.py``), and the net compiles once.

Dynamo once traced the whole pass pipeline for such a net (GoogLeNet: 35 s of tracing against
5 s), and the trace saw the program cache without the program, so the second call compiled
the net again. No timings here: the tests count graphs and see where the passes ran.
"""

from __future__ import annotations

import copy
import gc
import sys

import pytest
import torch

import torchcaffe.net.net as net_module

from .test_compile import _small_net


@pytest.fixture
def one_compile_only():
    """Dynamo with a budget of one graph per frame, and an error past it (not an eager run)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
        yield torch._dynamo.utils.counters
    torch._dynamo.reset()


def watch(monkeypatch, passes: str) -> list[str]:
    """The caller's function name each time the passes ``passes`` of ``net.net`` run. This
    counts the builds and names their caller; it does not by itself tell a traced build from
    an untraced one: dynamo breaks the graph at ``sys._getframe`` and runs the rest as Python,
    so a traced build shows as an extra graph, which the tests' graph counts catch (without
    ``build_untraced``'s marker: 2-3 graphs and 2 breaks)."""
    calls: list[str] = []
    optimize = getattr(net_module, passes)

    def watched(*args, **kwargs):
        calls.append(sys._getframe(1).f_code.co_name)
        return optimize(*args, **kwargs)

    monkeypatch.setattr(net_module, passes, watched)
    return calls


@pytest.fixture
def pass_calls(monkeypatch):
    return watch(monkeypatch, "optimize_for_inference")


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_fresh_net_compiles_once_and_builds_its_program_untraced(
    one_compile_only, pass_calls, dynamic
):
    net = _small_net()
    assert not net._programs
    compiled = torch.compile(net, dynamic=dynamic)
    x = torch.randn(2, 3, 13, 11)
    with torch.no_grad():
        first = compiled(data=x)
        second = compiled(data=x)
        want = net(data=x)
    assert one_compile_only["stats"]["unique_graphs"] == 1
    assert pass_calls == ["program_for_key"]  # built once
    for name in want:
        torch.testing.assert_close(first[name], want[name], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(second[name], want[name], rtol=1e-5, atol=1e-6)


def test_fresh_nets_of_one_architecture_share_the_graph_with_their_own_weights(
    one_compile_only,
):
    first, second = _small_net(), _small_net()
    with torch.no_grad():
        for p in second.parameters():
            p.add_(torch.randn_like(p))
    x = torch.randn(2, 3, 13, 11)
    with torch.inference_mode():
        got = [torch.compile(net)(data=x) for net in (first, second, first)]
        want = [net(data=x) for net in (first, second, first)]
    assert one_compile_only["stats"]["unique_graphs"] == 1
    for g, w in zip(got, want):
        torch.testing.assert_close(g["prob"], w["prob"], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(want[0]["prob"], want[1]["prob"])


def test_a_copy_compiles_after_its_original_is_gone(one_compile_only):
    """A copy's token names the copy (a pickled token would name the original, gone here)."""
    net = _small_net()
    twin = copy.deepcopy(net)
    with torch.no_grad():
        twin.layer("ip").weight.mul_(2)
    del net
    gc.collect()
    x = torch.randn(2, 3, 13, 11)
    with torch.inference_mode():
        got = torch.compile(twin)(data=x)
        want = twin(data=x)
    torch.testing.assert_close(got["prob"], want["prob"], rtol=1e-5, atol=1e-6)
    assert len(twin._programs) == 1


class Head(torch.nn.Module):
    """A user's model that holds a net and doubles one of its outputs."""

    def __init__(self, net: torch.nn.Module, output: str) -> None:
        super().__init__()
        self.net, self.output = net, output

    def forward(self, data: torch.Tensor) -> torch.Tensor:
        return self.net(data=data)[self.output] * 2


def test_a_fresh_net_inside_a_compiled_model_builds_untraced_without_graph_breaks(pass_calls):
    model = Head(_small_net(), "prob")
    torch._dynamo.reset()
    with torch.no_grad():
        report = torch._dynamo.explain(model)(torch.randn(2, 3, 13, 11))
    assert report.graph_break_count == 0 and report.graph_count == 1
    assert pass_calls == ["program_for_key"]


def test_a_fresh_net_compiled_for_training_builds_its_training_program_untraced(
    one_compile_only, monkeypatch
):
    calls = watch(monkeypatch, "optimize_for_training")
    net = _small_net()
    compiled = torch.compile(net)
    x = torch.randn(2, 3, 13, 11)
    for _ in range(2):
        net.zero_grad()
        compiled(data=x)["prob"].square().sum().backward()
    got = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    net(data=x)["prob"].square().sum().backward()
    assert one_compile_only["stats"]["unique_graphs"] == 1
    assert calls == ["program_for_key"]
    for g, p in zip(got, net.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)


def test_the_untraced_build_carries_the_mark_of_assume_constant_result():
    """``untraced_build`` sets the decorator's marker itself (the decorator would import dynamo
    into every net build); this torch's decorator must still set just that."""
    from torchcaffe.net import untraced_build

    def probe() -> None:
        pass

    torch.compiler.assume_constant_result(probe)
    assert getattr(probe, untraced_build.CONSTANT_MARKER) is True
    assert getattr(untraced_build.build_untraced, untraced_build.CONSTANT_MARKER) is True
