"""Net surgery through the Caffe face's numpy views between forwards reaches the next forward.

The inference program folds BatchNorm/Scale into the Convolution and caches the folded (and
channels_last) weights on the source tensors' versions. A write through
``net.params[name][i].data`` (a numpy view of the same memory) bumps no version, so the Caffe
face tells the net (``TorchNet.params_changed``) before the next run; a held view keeps doing
so until it is dropped. Caffe reads the params as they are at each forward.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcaffe
import torchcaffe as caffe
from torchcaffe.ops import onednn_conv

NET = """
input: "data" input_shape { dim: 2 dim: 3 dim: 4 dim: 4 }
layer { name: "c" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c"
  batch_norm_param { use_global_stats: true } }
layer { name: "s" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
"""
X = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)


def _want(net, mean: float) -> np.ndarray:
    """Conv + BatchNorm (variance 1, factor 1) + Scale (gamma 1, beta 0) from the params now."""
    w, b = net.params["c"][0].data.reshape(3, 3), net.params["c"][1].data
    return (np.einsum("oc,nchw->nohw", w, X) + b[None, :, None, None] - mean) / np.sqrt(1 + 1e-5)


@pytest.fixture
def net(tmp_path):
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET)
    net = caffe.Net(str(proto), caffe.TEST)
    net.params["bn"][1].data[...] = 1  # variance
    net.params["bn"][2].data[...] = 1  # scale factor
    net.blobs["data"].data[...] = X
    net.forward()
    assert net.module.optimized_program().report["fold_batchnorm_scale_into_producer"] == 1
    return net


def test_a_param_written_between_forwards_reaches_the_next_forward(net):
    net.params["c"][0].data[...] *= 2  # surgery between two forwards
    net.params["bn"][0].data[...] = 5.0  # mean
    got = net.forward()["c"]
    assert not net._written_params  # no view held: later runs reuse the new fold
    np.testing.assert_allclose(got, _want(net, 5.0), rtol=1e-4, atol=1e-5)


def test_a_held_view_written_later_reaches_every_forward(net):
    weight = net.params["c"][0].data  # kept, written after the next forward
    net.forward()
    weight[...] = 3.0
    np.testing.assert_allclose(net.forward()["c"], _want(net, 0.0), rtol=1e-4, atol=1e-5)
    weight[0] = -1.0
    np.testing.assert_allclose(net.forward()["c"], _want(net, 0.0), rtol=1e-4, atol=1e-5)
    del weight
    net.forward()
    assert not net._written_params  # the view is gone: the fold is kept again


def test_the_fold_is_reused_when_no_param_was_handed_out(net, monkeypatch):
    calls = []
    monkeypatch.setattr(net.module, "params_changed", lambda: calls.append(1))
    net.blobs["data"].data[...] = X  # an input blob, not a param
    net.forward()
    assert calls == []


def test_torch_face_params_changed_after_a_write_through_a_numpy_view(tmp_path):
    net = torchcaffe.load(torchcaffe.formats.prototxt.read_net(NET))
    with torch.no_grad():
        net.layer("bn").variance.fill_(1.0)
        net.layer("bn").scale_factor.fill_(1.0)
    x = torch.from_numpy(X)
    with torch.inference_mode():
        before = net(data=x)["c"]
    net.layer("c").weight.detach().numpy()[...] *= 2  # a numpy view: no version sees it
    with torch.inference_mode():
        stale = net(data=x)["c"]
    assert torch.equal(stale, before)  # what params_changed is for
    net.params_changed()
    with torch.inference_mode():
        fresh = net(data=x)["c"]
    bias = net.layer("c").bias.view(1, 3, 1, 1)
    torch.testing.assert_close(fresh - bias, 2 * (before - bias), rtol=1e-5, atol=1e-5)


def test_surgery_reaches_a_fold_the_layout_pass_wrapped(tmp_path):
    """A folded 3x3 conv over 16 channels and 784 positions runs inside channels_last_layout's
    wrapper; params_changed still finds its fold (it used not to: a stale fold, silently)."""
    text = NET.replace("dim: 2 dim: 3 dim: 4 dim: 4", "dim: 1 dim: 16 dim: 28 dim: 28")
    text = text.replace("kernel_size: 1", "kernel_size: 3 pad: 1")
    x = np.random.default_rng(1).standard_normal((1, 16, 28, 28)).astype(np.float32)
    proto = tmp_path / "wide.prototxt"
    proto.write_text(text)
    net = caffe.Net(str(proto), caffe.TEST)
    net.params["bn"][1].data[...] = 1
    net.params["bn"][2].data[...] = 1
    net.blobs["data"].data[...] = x
    net.forward()
    keys = {s.key for p in net.module._programs.values() for s in p.steps}
    assert "c+folded+nhwc" in keys
    net.params["bn"][0].data[...] = 5.0  # mean, through the numpy view
    got = net.forward()["c"].copy()
    w, b = (torch.from_numpy(net.params["c"][i].data).double() for i in (0, 1))
    conv = torch.nn.functional.conv2d(torch.from_numpy(x).double(), w, b, padding=1)
    want = (conv.numpy() - 5.0) / np.sqrt(1 + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_params_changed_forgets_a_batchnorms_cached_statistics():
    """Off the CPU a BatchNorm keeps its scaled statistics on the blobs' versions, which a
    write through ``.data`` does not bump."""
    net = torchcaffe.load(torchcaffe.formats.prototxt.read_net(NET)).to("meta")
    bn = net.layer("bn")
    first = bn.global_stats()
    assert bn.global_stats()[0] is first[0]
    net.params_changed()
    assert bn.global_stats()[0] is not first[0]


def test_surgery_reaches_a_packed_pointwise_convolution(tmp_path):
    """An unfolded 1x1 convolution inside a channels_last region runs on its packed weight;
    a write through the numpy view reaches the next forward."""
    text = """
    input: "data" input_shape { dim: 1 dim: 8 dim: 32 dim: 32 }
    layer { name: "a" type: "Convolution" bottom: "data" top: "a" convolution_param {
      num_output: 16 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.1 } } }
    layer { name: "c" type: "Convolution" bottom: "a" top: "c" convolution_param {
      num_output: 16 kernel_size: 1 weight_filler { type: "gaussian" std: 0.1 } } }
    """
    proto = tmp_path / "pointwise.prototxt"
    proto.write_text(text)
    net = caffe.Net(str(proto), caffe.TEST)
    net.blobs["data"].data[...] = np.random.default_rng(2).standard_normal((1, 8, 32, 32))
    net.forward()
    if onednn_conv.available() and torch.backends.mkldnn.enabled:
        assert net.module.layer("c").weight_cache._entry is not None  # packed
    net.params["c"][0].data[...] *= 2
    net.params["c"][1].data[...] = 0
    got = net.forward()["c"].copy()
    a, w = net.blobs["a"].data, net.params["c"][0].data.reshape(16, 16)
    np.testing.assert_allclose(got, np.einsum("oc,nchw->nohw", w, a), rtol=1e-4, atol=1e-5)
