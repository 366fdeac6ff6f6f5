"""Before each run the Caffe face pulls params edited on the other side into the module's
tensors; on the CPU it looks at the params only when some memory's device side may have
become current since it last did (``SyncedMemory.device_heads``); in GPU mode, only when
some param's host side may have (``SyncedMemory.watched_host_heads``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcaffe as caffe
from torchcaffe import syncedmem
from torchcaffe.errors import UsageError
from torchcaffe.pycaffe import net as pycaffe_net
from torchcaffe.syncedmem import Head

NET = """
input: "data" input_shape { dim: 2 dim: 3 }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "f"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
"""


@pytest.fixture
def net(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    return caffe.Net(str(path), caffe.TEST)


@pytest.fixture
def scans(monkeypatch):
    calls = []
    real = pycaffe_net.memories_at
    monkeypatch.setattr(pycaffe_net, "memories_at", lambda *a: calls.append(1) or real(*a))
    return calls


def _want(net, x):
    w, b = (p.data for p in net.params["ip"])
    return x @ w.T + b


def test_params_are_looked_at_only_after_a_device_side_write(net, scans):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    net.forward(data=x)
    scanned = len(scans)
    net.forward(data=x)
    assert len(scans) == scanned  # nothing moved to a device side: no scan
    # a second host buffer stands in for the device side (as in tests/test_syncedmem.py)
    weight = net.params["ip"][0]
    weight.data_memory.set_gpu_data(torch.full((6,), 0.5))
    out = net.forward(data=x)["f"]
    assert len(scans) == scanned + 1
    np.testing.assert_allclose(out, _want(net, x), rtol=1e-6)
    assert (net.params["ip"][0].data == 0.5).all()


def test_in_gpu_mode_params_are_looked_at_only_after_a_host_side_write(net, scans, meta_gpu_mode):
    """The GPU-mode mirror: a script writes the input's host side on every run, which does
    not make the params looked at; a param's host-side write does, once, and reaches the
    module's device tensor (``SyncedMemory.watched_host_heads``)."""
    copies = []
    hook = lambda memory, direction: copies.append((memory, direction))  # noqa: E731
    syncedmem.copy_hooks.append(hook)
    try:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        net.forward(data=x)
        scanned = len(scans)
        net.blobs["data"].data[...] = x
        net.forward()
        assert len(scans) == scanned
        weight, bias = net.params["ip"]
        weight.data[...] = 0.5
        bias.set_cpu_data(torch.zeros(2))
        del copies[:]
        net.forward(data=x)
        assert len(scans) == scanned + 1
        to_device = {id(memory) for memory, direction in copies if direction == "cpu->gpu"}
        assert {id(weight.data_memory), id(bias.data_memory)} <= to_device
        assert weight.data_memory.head is bias.data_memory.head is Head.SYNCED
        net.forward(data=x)
        assert len(scans) == scanned + 1
    finally:
        syncedmem.copy_hooks.remove(hook)


def test_param_blobs_follow_a_module_the_script_converted(tmp_path):
    """``net.module.double().float()`` (or ``.to(...)``, ``share_memory()``) gives the params
    new memory: net surgery through ``net.params``, by a Blob held from before too, reaches
    the module's new tensors, and backward's diffs reach the blobs."""
    path = tmp_path / "net.prototxt"
    path.write_text("force_backward: true\n" + NET)
    net = caffe.Net(str(path), caffe.TEST)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    held = net.params["ip"][0]
    net.forward(data=x)
    net.module.double().float()
    held.data[...] = 0.25
    net.params["ip"][1].data[...] = -1.0
    out = net.forward(data=x)["f"]
    np.testing.assert_allclose(out, x @ np.full((3, 2), 0.25, np.float32) - 1.0, rtol=1e-6)
    net.module.share_memory()
    net.forward(data=x)
    net.blobs["f"].diff[...] = 1.0
    net.backward()
    np.testing.assert_allclose(held.diff, np.tile(x.sum(0), (2, 1)), rtol=1e-6)


def test_a_module_converted_to_another_dtype_is_refused_by_name(net):
    """pycaffe computes in float32 alone; torch would stop inside the first layer."""
    x = np.ones((2, 3), np.float32)
    net.module.double()
    with pytest.raises(
        UsageError, match="float32, as pycaffe does; its module is now torch.float64"
    ):
        net.forward(data=x)
    net.module.float()
    np.testing.assert_allclose(net.forward(data=x)["f"], _want(net, x), rtol=1e-6)


def test_a_module_made_channels_last_is_bound_contiguous_again(tmp_path):
    """A Blob is a flat view of its param: ``net.module.to(memory_format=channels_last)``
    leaves the params as they were laid out in Caffe, with the same values."""
    path = tmp_path / "conv.prototxt"
    path.write_text(
        'input: "data" input_shape { dim: 1 dim: 2 dim: 4 dim: 4 }\n'
        'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param '
        '{ num_output: 3 kernel_size: 3 weight_filler { type: "gaussian" } } }'
    )
    net = caffe.Net(str(path), caffe.TEST)
    x = np.random.RandomState(0).randn(1, 2, 4, 4).astype(np.float32)
    net.module.to(memory_format=torch.channels_last)
    net.params["c"][0].data[...] = 0.5
    got = net.forward(data=x)["c"]
    np.testing.assert_allclose(got[0, :, 0, 0], [0.5 * x[0, :, :3, :3].sum()] * 3, rtol=1e-5)
    assert net.module.layer("c").weight.is_contiguous()
