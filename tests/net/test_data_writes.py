"""Writes through a param's ``.data`` reach the next inference (``ops/data_watch``).

Inference keeps folded and packed weights on the params' version counters, which ``p.data``
does not share. Every param blob is a ``CaffeParameter``, whose ``.data`` tells the caches to
look again, eager or compiled, so the idioms of net surgery and weight init need no
``params_changed``.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import torchcaffe
from torchcaffe.ops.data_watch import CaffeParameter

from .test_opaque_conv import _input, _net

# test_opaque_conv's net: conv1 folds BatchNorm + Scale and runs on a packed weight; conv2
# (1x1, inside conv1's channels_last region) runs unfolded on its own packed weight; fc is a
# product over pooled features.
X = _input()


def _fresh_run(net: torchcaffe.TorchNet) -> torch.Tensor:
    """What a net holding ``net``'s blobs now (as a caffemodel would) computes, with nothing
    cached yet."""
    other = _net()
    with torch.no_grad():
        for name in net.layer_names:
            for mine, theirs in zip(other.layer(name).param_blobs(), net.layer(name).param_blobs()):
                mine.copy_(theirs)
    with torch.inference_mode():
        return other(data=X)["fc"]


def _write(param: torch.Tensor, how: str) -> None:
    new = torch.rand(param.shape, generator=torch.Generator().manual_seed(5)) + 0.5
    if how == "copy_":
        param.data.copy_(new)
    elif how == "index":
        param.data[...] = new
    elif how == "in-place op":
        param.data.mul_(new)
    elif how == "setter":
        param.data = new
    else:
        raise AssertionError(how)


BLOBS = [("conv1", 0), ("sc1", 0), ("sc1", 1), ("conv2", 0), ("fc", 0)]
HOW = ["copy_", "index", "in-place op", "setter"]


def test_param_blobs_are_caffe_parameters_that_print_as_parameters():
    net = _net()
    params = list(net.parameters())
    assert params and all(type(p) is CaffeParameter for p in params)
    weight = net.layer("fc").weight
    assert isinstance(weight, nn.Parameter)
    assert repr(weight) == repr(nn.Parameter(weight.detach()))


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("layer,index", BLOBS)
def test_a_write_through_data_reaches_the_next_inference(layer, index, how):
    net = _net()
    with torch.inference_mode():
        before = net(data=X)["fc"]
    # (the folded and packed weights are cached now)
    blob = net.layer(layer).param_blobs()[index]
    _write(blob, how)
    with torch.inference_mode():
        got = net(data=X)["fc"]
    want = _fresh_run(net)
    assert not torch.allclose(want, before)  # the write changed the answer
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer,index", [("conv1", 0), ("sc1", 0), ("conv2", 0)])
def test_a_write_through_data_reaches_a_compiled_net(layer, index):
    net = _net()
    torch._dynamo.reset()
    compiled = torch.compile(net)
    with torch.inference_mode():
        compiled(data=X)
    _write(net.layer(layer).param_blobs()[index], "copy_")
    with torch.inference_mode():
        got = compiled(data=X)["fc"]
    torch.testing.assert_close(got, _fresh_run(net), rtol=1e-5, atol=1e-5)


def _swapped_to_double(net: torchcaffe.TorchNet) -> torchcaffe.TorchNet:
    """``net.to(float64)`` with torch's param swap on conversion (new Parameter objects)."""
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        return net.to(torch.float64).to(torch.float32)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)


@pytest.mark.parametrize(
    "copier",
    [copy.deepcopy, lambda n: pickle.loads(pickle.dumps(n)), _swapped_to_double],
    ids=["deepcopy", "pickle", "swapped .to()"],
)
def test_a_copied_net_watches_its_own_params(copier):
    net = _net()
    with torch.inference_mode():
        net(data=X)
    twin = copier(net)
    assert all(type(p) is CaffeParameter for p in twin.parameters())
    with torch.inference_mode():
        twin(data=X)
    _write(twin.layer("conv1").weight, "index")
    with torch.inference_mode():
        got = twin(data=X)["fc"]
    torch.testing.assert_close(got, _fresh_run(twin), rtol=1e-5, atol=1e-5)


def test_a_parameter_put_in_a_blobs_place_is_watched_too():
    net = _net()
    own = nn.Parameter(net.layer("conv2").weight.detach().clone())
    net.layer("conv2").weight = own
    assert type(own) is CaffeParameter  # the same object, watched
    with torch.inference_mode():
        net(data=X)
    _write(own, "copy_")
    with torch.inference_mode():
        got = net(data=X)["fc"]
    torch.testing.assert_close(got, _fresh_run(net), rtol=1e-5, atol=1e-5)


def test_a_parameter_made_from_a_param_blob_is_one_too():
    """``nn.Parameter(p)`` builds a subclass's Parameter from its ``detach()`` and refuses
    another type: weight tying and ``parametrize``'s weight_norm go through it."""
    net = _net()
    weight = net.layer("conv2").weight
    tied = nn.Parameter(weight)
    assert type(tied) is CaffeParameter and tied.requires_grad
    assert tied.data_ptr() == weight.data_ptr()
    assert type(weight.detach()) is torch.Tensor  # elsewhere, torch's detach


def test_weight_norm_on_a_layer_keeps_its_values_and_follows_its_g(tmp_path):
    net = _net()
    with torch.inference_mode():
        before = net(data=X)["fc"]
    conv = net.layer("conv2")
    torch.nn.utils.parametrizations.weight_norm(conv, "weight")
    with torch.inference_mode():
        torch.testing.assert_close(net(data=X)["fc"], before, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        conv.parametrizations.weight.original0.mul_(1.5)  # g
    with torch.inference_mode():
        got = net(data=X)["fc"]
    torch.testing.assert_close(got, _fresh_run(net), rtol=1e-5, atol=1e-5)
    torchcaffe.save_weights(net, tmp_path / "w.caffemodel")  # the weights it computes
    reloaded = _net()
    torchcaffe.load_weights(reloaded, tmp_path / "w.caffemodel")
    with torch.inference_mode():
        torch.testing.assert_close(reloaded(data=X)["fc"], got, rtol=1e-5, atol=1e-5)
