"""A module put in ``net.layers`` after a forward is the one the next forward runs
(torchcaffe/net/layer_dict.py): the passes' programs, made from the old modules, are made
again, in eager mode and under torch.compile."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
import torch
from google.protobuf import text_format

import torchcaffe
from torchcaffe.converters import load_readable_state_dict, readable_state_dict
from torchcaffe.errors import (
    LayerParamError,
    PartialWeightsWarning,
    UnsupportedError,
    UsageError,
)
from torchcaffe.proto import caffe_pb2

from ..helpers.params import centered_weights, fill_params
from ..helpers.programs import off_cpu_programs
from .test_hooks import NET, caffe_face_after_a_forward  # conv+bn+sc folded, ReLUs fused


def _net(phase: str = "test") -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(NET, caffe_pb2.NetParameter()), phase=phase)
    fill_params(net, centered_weights(1.0), seed=3)
    with torch.no_grad():
        net.layer("bn").variance.abs_().add_(0.5)
        net.layer("bn").scale_factor.fill_(1.0)
    return net


def _head(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(144, 5))


def _features(net: torchcaffe.TorchNet, x: torch.Tensor) -> torch.Tensor:
    """relu(sc(bn(conv(x)))), the head's bottom, from the layers called one by one."""
    layer = net.layer
    return torch.relu(layer("sc")(layer("bn")(layer("conv")(x))))


def _assert_runs(
    net: torchcaffe.TorchNet, head: torch.nn.Module, x: torch.Tensor, run: Any = None
) -> None:
    """``run`` (default: ``net``) computes relu(head(features)), as the layers give it."""
    with torch.no_grad():
        want = torch.relu(head(_features(net, x)))
    with torch.inference_mode():
        got = (net if run is None else run)(data=x)["f"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_head_put_in_after_a_forward_is_the_one_that_runs():
    net = _net()
    x = torch.rand(2, 3, 8, 8)
    with torch.inference_mode():
        net(data=x)  # the program is made from the InnerProduct
    head = _head()
    net.layers["ip"] = head
    _assert_runs(net, head, x)
    other = _head(seed=1)
    net.layers.ip = other  # attribute assignment skips add_module
    _assert_runs(net, other, x)
    net.layers.update({"ip": head})
    _assert_runs(net, head, x)
    _assert_runs(net, head, torch.rand(5, 3, 8, 8))  # a new input shape: checked up to ip
    with pytest.raises(LayerParamError, match="conv"):  # a layer before it still checks
        net(data=torch.rand(5, 4, 8, 8))


def test_a_replaced_head_trains_and_its_gradient_is_its_own():
    """A recorded forward after the swap: the new head's params get the gradient an
    independent computation gives; the old InnerProduct gets none."""
    net = _net(phase="train")
    x = torch.rand(2, 3, 8, 8)
    old = net.layer("ip")
    net(data=x)["f"].sum().backward()
    old.zero_grad(set_to_none=True)
    head = _head()
    net.layers["ip"] = head
    weights = torch.rand(2, 5)
    (net(data=x)["f"] * weights).sum().backward()
    got = head[1].weight.grad.clone()
    assert float(got.abs().sum()) > 0
    head.zero_grad(set_to_none=True)
    (torch.relu(head(_features(net, x).detach())) * weights).sum().backward()
    torch.testing.assert_close(got, head[1].weight.grad, rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in old.parameters())


def test_the_nets_param_slots_follow_the_swap():
    """With the Caffe layers frozen, the head's params alone make a forward one autograd
    records (the training program)."""
    net = _net()
    net.requires_grad_(False)
    x = torch.rand(2, 3, 8, 8)
    net(data=x)
    assert not net._records_autograd({"data": x})
    net.layers["ip"] = _head()
    net(data=x)
    assert net._records_autograd({"data": x})


def test_copies_and_pickles_run_the_swapped_head():
    net = _net()
    x = torch.rand(2, 3, 8, 8)
    with torch.inference_mode():
        net(data=x)
    net.layers["ip"] = _head()
    for clone in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        _assert_runs(clone, clone.layers["ip"], x)
        clone.layers["ip"] = _head(seed=2)
        _assert_runs(clone, clone.layers["ip"], x)
    _assert_runs(net, net.layers["ip"], x)  # the copies' swaps left the original alone


def test_a_compiled_net_traces_the_swapped_head():
    net = _net()
    x = torch.rand(2, 3, 8, 8)
    compiled = torch.compile(net)
    with torch.inference_mode():
        compiled(data=x)
    head = _head()
    net.layers["ip"] = head
    _assert_runs(net, head, x, run=compiled)


def test_param_groups_train_the_swapped_head_at_the_base_rate():
    net = _net(phase="train")
    head = _head()
    net.layers["ip"] = head
    groups = torchcaffe.param_groups(net, lr=0.1)
    grouped = {id(p): g for g in groups for p in g["params"]}
    for p in head.parameters():
        assert grouped[id(p)]["multipliers"] == (1.0, 1.0)
        assert grouped[id(p)]["lr"] == 0.1
    before = head[1].weight.detach().clone()
    opt = torch.optim.SGD(groups, lr=0.1)
    net(data=torch.rand(2, 3, 8, 8))["f"].sum().backward()
    opt.step()
    assert not torch.equal(head[1].weight, before)


def test_what_needs_a_caffe_layer_names_the_swapped_one(tmp_path):
    net = _net()
    net.layers["ip"] = _head()
    assert net.layer("ip") is net.layers["ip"]
    with pytest.raises(UnsupportedError, match="'ip' is a Sequential put in net.layers"):
        net.infer_shapes({"data": (4, 3, 8, 8)})
    target = tmp_path / "net.caffemodel"
    with pytest.raises(UnsupportedError, match="'ip'"):
        torchcaffe.save_weights(net, str(target))
    assert not target.exists() and not list(tmp_path.iterdir())  # nothing half-written


def test_a_hooked_module_put_in_runs_its_hooks_on_the_first_forward():
    net = _net()
    x = torch.rand(2, 3, 8, 8)
    with torch.inference_mode():
        net(data=x)
    relu = torch.nn.LeakyReLU(0.5)
    calls: list[tuple[int, ...]] = []
    relu.register_forward_hook(lambda m, i, o: calls.append(tuple(o.shape)))
    net.layers["relu2"] = relu
    with torch.inference_mode():
        net(data=x)
    assert calls == [(2, 5)]


def test_a_hook_registered_later_on_a_module_put_in_runs():
    """A module not of torchcaffe's own is called as a module by the eager walk: its hook
    registrations bump no count a net watches (``hook_watch``), yet its hooks run."""
    net = _net()
    x = torch.rand(2, 3, 8, 8)
    relu = torch.nn.LeakyReLU(0.5)
    net.layers["relu2"] = relu
    with torch.inference_mode():
        net(data=x)
    calls: list[tuple[int, ...]] = []
    relu.register_forward_hook(lambda m, i, o: calls.append(tuple(o.shape)))
    with torch.inference_mode():
        net(data=x)
    assert calls == [(2, 5)]


class _Affine(torch.nn.Module):
    """A user's per-channel affine, in a Scale's place (no CaffeLayer: nothing to fold)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 2.0, 4).view(1, 4, 1, 1))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t * self.w - 0.25


def _swapped(slot: str) -> torch.nn.Module:
    torch.manual_seed(5)
    return {
        "conv": lambda: torch.nn.Conv2d(3, 4, 3),
        "sc": _Affine,
        "relu": lambda: torch.nn.LeakyReLU(0.5),
    }[slot]()


@pytest.mark.parametrize("slot", ["conv", "sc", "relu"])
@pytest.mark.parametrize("program", ["CPU", "GPU"])
@pytest.mark.parametrize("record", [False, True], ids=["inference", "fwd+bwd"])
def test_the_passes_leave_a_module_put_in_as_it_is(slot, program, record, monkeypatch):
    """Put in before the first forward, in the place of a layer the passes would fold into
    (conv), fold (sc) or fuse (relu): it runs as it is, in each program."""
    net = _net(phase="train" if record else "test")
    if program == "GPU":
        off_cpu_programs(monkeypatch, net)
    net.layers[slot] = _swapped(slot)
    x = torch.rand(2, 3, 8, 8)
    layer = net.layers
    with torch.no_grad():  # the layers one by one (a train-phase BatchNorm: batch stats)
        bn = layer["bn"](layer["conv"](x))
        want = torch.relu(layer["ip"](layer["relu"](layer["sc"](bn))))
    if record:
        got = net(data=x.requires_grad_())["f"].detach()
    else:
        with torch.inference_mode():
            got = net(data=x)["f"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_caffe_face_refuses_a_net_whose_layers_were_swapped(tmp_path):
    """The Caffe face's blobs and params views follow the layers it was built from: a forward
    after a swap in ``net.module.layers`` is a UsageError, not params showing the old layer."""
    net = caffe_face_after_a_forward(tmp_path)
    net.module.layers["ip"] = _head()
    with pytest.raises(UsageError, match="after this Caffe-face Net was built"):
        net.forward()


def test_torch_func_runs_a_net_with_a_swapped_head():
    """Per-sample gradients (vmap over grad) of the new head's weight, as torch.func gives
    them for the same computation written out; each sample is a new input shape (batch 1),
    so the shape check runs up to the head and leaves it to run."""
    net = _net()  # (TEST: a train-phase BatchNorm's running averages refuse vmap)
    head = _head()
    net.layers["ip"] = head
    x = torch.rand(3, 3, 8, 8)
    params = dict(head.named_parameters())

    def loss(p, sample):
        out = torch.func.functional_call(
            net, {f"layers.ip.{k}": v for k, v in p.items()}, (), {"data": sample[None]}
        )
        return out["f"].sum()

    def reference(p, sample):
        feats = _features(net, sample[None]).detach()
        return torch.relu(torch.func.functional_call(head, p, (feats,))).sum()

    got = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    want = torch.func.vmap(torch.func.grad(reference), in_dims=(None, 0))(params, x)
    torch.testing.assert_close(got["1.weight"], want["1.weight"], rtol=1e-5, atol=1e-6)


def test_readable_state_dict_keeps_the_swapped_heads_params():
    """``readable_state_dict`` (and safetensors, which writes it) lists a user's module by
    its own state_dict names under the layer's; it had silently left them out."""
    net = _net()
    head = _head()
    net.layers["ip"] = head
    state = readable_state_dict(net)
    torch.testing.assert_close(state["ip.1.weight"], head[1].weight.detach())
    torch.testing.assert_close(state["ip.1.bias"], head[1].bias.detach())
    assert "conv.weight" in state and "bn.running_mean" in state
    other = _net()
    other.layers["ip"] = _head(seed=7)
    load_readable_state_dict(other, state)
    torch.testing.assert_close(other.layers["ip"][1].weight, head[1].weight)
    x = torch.rand(2, 3, 8, 8)
    with torch.inference_mode():
        torch.testing.assert_close(other(data=x)["f"], net(data=x)["f"])


def test_a_swapped_scale_is_not_read_as_its_batchnorms_affine():
    """A Caffe Scale after a BatchNorm becomes that BatchNorm's weight and bias in the
    readable keys; a user's module in the Scale's place keeps its own names."""
    net = _net()
    net.layers["sc"] = _Affine()
    state = readable_state_dict(net)
    assert "sc.w" in state and "bn.running_mean" in state
    assert not any(key.startswith("bn.w") for key in state)


def test_caffe_weights_load_around_the_swapped_head(tmp_path):
    """``load_weights`` copies every other layer and names the layer whose place holds a
    user's module (Caffe skips a file's layer the net no longer has; fine-tuning renames the
    head in the prototxt for that). The head keeps its own values."""
    source = _net()
    path = tmp_path / "trained.caffemodel"
    torchcaffe.save_weights(source, str(path))
    net = torchcaffe.load(text_format.Parse(NET, caffe_pb2.NetParameter()), phase="test")
    head = _head()
    before = head[1].weight.detach().clone()
    net.layers["ip"] = head
    with pytest.warns(PartialWeightsWarning, match="'ip' were not copied"):
        filled = torchcaffe.load_weights(net, str(path), strict=True)
    assert "ip" not in filled and "conv" in filled
    torch.testing.assert_close(net.layer("conv").weight, source.layer("conv").weight)
    torch.testing.assert_close(head[1].weight, before)
