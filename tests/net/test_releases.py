"""Blob release (OptimizedProgram.with_releases): a program run drops each unobserved blob
after its last reader, as a torch model drops its locals, so an intermediate is freed while
the forward still runs. Outputs and gradients are those of the layer-by-layer run."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import torch
from google.protobuf import text_format

import torchcaffe
from torchcaffe.proto import caffe_pb2

# c is read by the Eltwise only (whose backward saves nothing), so nothing keeps it alive but
# the run's blob dict; r is rewritten in place by the ReLU and read twice after.
NET = """
name: "r"
input: "data" input_shape { dim: 2 dim: 3 dim: 5 dim: 4 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 3 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "sum" type: "Eltwise" bottom: "c" bottom: "data" top: "r" }
layer { name: "relu" type: "ReLU" bottom: "r" top: "r" }
layer { name: "ip" type: "InnerProduct" bottom: "r" top: "o1"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "r" top: "o2"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "out" type: "Eltwise" bottom: "o1" bottom: "o2" top: "out" }
"""


def _net() -> torchcaffe.TorchNet:
    torch.manual_seed(0)
    return torchcaffe.load(text_format.Parse(NET, caffe_pb2.NetParameter()), phase="train")


def _names(program, step_name: str) -> set[str]:
    i = next(k for k, s in enumerate(program.steps) if s.name == step_name)
    return set(program.releases[i])


def test_each_unobserved_blob_is_released_after_its_last_reader():
    net = _net()
    for program in (net.optimized_program(), net.training_program()):
        assert "c" in _names(program, "sum")
        assert {"o1", "o2"} <= _names(program, "out")
        released = {b for names in program.releases for b in names}
        assert "out" not in released  # observed
    everything = net.optimized_program(net.blob_names)
    assert not any(everything.releases)


def test_an_intermediate_is_freed_before_the_forward_returns():
    """Probed by wrapping the program's calls of conv and ip2 (its ``eager_walk``): a
    ``forward`` given to a layer would make the net run its layers as modules, without the
    program (``ops/hook_watch.py``)."""
    net = _net()
    x = torch.randn(2, 3, 5, 4)
    program = net.optimized_program()
    with torch.no_grad():
        net(data=x)
    assert net.optimized_program() is program  # the one a forward without autograd runs
    seen: dict[str, Any] = {}
    walk = list(program.eager_walk)
    at = {entry[3]: i for i, entry in enumerate(walk)}  # tops -> index
    conv_call, ip2_call = walk[at[("c",)]][0], walk[at[("o2",)]][0]

    def keep_conv_top(*bottoms):
        output = conv_call(*bottoms)
        seen["c"] = weakref.ref(output)
        return output

    def check_at_ip2(*bottoms):
        gc.collect()
        seen["alive_at_ip2"] = seen["c"]() is not None
        return ip2_call(*bottoms)

    walk[at[("c",)]] = (keep_conv_top, *walk[at[("c",)]][1:])
    walk[at[("o2",)]] = (check_at_ip2, *walk[at[("o2",)]][1:])
    object.__setattr__(program, "eager_walk", tuple(walk))
    with torch.no_grad():
        net(data=x)
    assert seen["alive_at_ip2"] is False


def test_outputs_and_gradients_equal_the_unreleased_run():
    net = _net()
    x = torch.randn(2, 3, 5, 4)
    got_x, want_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = net(data=got_x)["out"]
    got.sum().backward()
    got_grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    net.optimize = False
    want = net(data=want_x)["out"]
    want.sum().backward()
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(got_x.grad.numpy(), want_x.grad.numpy(), rtol=1e-6)
    for g, p in zip(got_grads, net.parameters()):
        np.testing.assert_allclose(g.numpy(), p.grad.numpy(), rtol=1e-6)


def test_walk_is_the_steps_as_plain_literals():
    """What ``TorchNet.run`` reads per step, as strings, bools and None only: torch.compile
    then guards the whole walk as one value (see OptimizedProgram.walk)."""
    net = torchcaffe.load(text_format.Parse(_WALK_NET, caffe_pb2.NetParameter()), phase="test")
    program = net.optimized_program()
    assert len(program.walk) == len(program.steps)
    for (key, bottoms, keeps, tops, dead), step, released in zip(
        program.walk, program.steps, program.releases
    ):
        assert key == (None if step.is_input else step.key)
        assert (bottoms, keeps) == (step.bottoms, step.propagate_down)
        assert (tops, dead) == (step.tops, released)

    def literal(v):
        if isinstance(v, tuple):
            return all(literal(x) for x in v)
        return v is None or type(v) in (str, bool)

    assert literal(program.walk)


_WALK_NET = """
input: "data" input_shape { dim: 1 dim: 2 dim: 3 dim: 3 }
layer { name: "c" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 2 kernel_size: 1 } }
layer { name: "r" type: "ReLU" bottom: "c" top: "c" }
layer { name: "s" type: "Split" bottom: "c" top: "s1" top: "s2" }
layer { name: "e" type: "Eltwise" bottom: "s1" bottom: "s2" top: "e" propagate_down: false
  propagate_down: true }
"""


def test_eager_walk_is_the_walk_with_its_runners_and_drops_the_same_blobs():
    """An eager run reads ``eager_walk`` (the runners themselves): the same steps, reads and
    releases as ``walk``, an unread input released before the first step."""
    text = 'input: "unread" input_shape { dim: 1 }\n' + _WALK_NET
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="test")
    program = net.training_program()  # e reads s1 detached (propagate_down: false)
    steps = [entry for entry in program.walk if entry[0] is not None]
    assert len(program.eager_walk) == len(steps)
    for (runner, bottoms, keeps, tops, dead), (key, names, flags, tops2, dead2) in zip(
        program.eager_walk, steps
    ):
        layer = program.runners[key]  # a module is called through its forward
        assert runner is layer or runner == getattr(layer, "forward", None)
        assert (bottoms, tops, dead) == (names, tops2, dead2)
        assert keeps == (None if all(flags) else flags)
    assert any(keeps is not None for _, _, keeps, _, _ in program.eager_walk)
    assert program.input_releases == ()  # an unread blob is a net output
    only_e = net.optimized_program({"e"})
    assert only_e.input_releases == ("unread",)
    blobs = {"unread": torch.zeros(1), "data": torch.randn(1, 2, 3, 3)}
    with torch.no_grad():
        assert set(net.run(blobs, program=only_e)) == {"e"}


def test_a_hooked_net_frees_an_intermediate_after_its_last_reader():
    """A hooked net runs Caffe's literal program, each layer a module, with releases too
    (``TorchNet._literal_program``); so does one with the passes off. Every blob asked for
    (``forward_all_blobs``) is kept."""
    net = _net()
    seen: dict[str, Any] = {}

    def keep(module, inputs, output):
        seen["c"] = weakref.ref(output)

    def check(module, inputs):
        gc.collect()
        seen["alive_at_ip2"] = seen["c"]() is not None

    handles = [
        net.layer("conv").register_forward_hook(keep),
        net.layer("ip2").register_forward_pre_hook(check),
    ]
    x = torch.randn(2, 3, 5, 4)
    for optimize in (True, False):
        net.optimize = optimize
        with torch.no_grad():
            net(data=x)
        assert seen["alive_at_ip2"] is False, optimize
        with torch.no_grad():
            blobs = net.forward_all_blobs(data=x)
        assert seen["alive_at_ip2"] is True and blobs["c"] is seen["c"](), optimize
    for handle in handles:
        handle.remove()
