"""A layer that updates its own param blobs in forward (BatchNorm's running statistics in
TRAIN) writes them on the device in GPU mode: the Caffe face's host view must follow, as
Caffe's mutable_gpu_data moves the head. Found by the golden cases in GPU mode (the host view
still held the loaded statistics after a forward on an H100)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcaffe as caffe
from torchcaffe import syncedmem
from torchcaffe.syncedmem import Head

PROTO = """
input: "x" input_shape { dim: 4 dim: 3 dim: 5 dim: 5 }
layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y" }
layer { name: "conv" type: "Convolution" bottom: "y" top: "z"
        convolution_param { num_output: 2 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.1 } } }
"""


@pytest.fixture
def train_net(tmp_path):
    path = tmp_path / "bn.prototxt"
    path.write_text(PROTO)
    return caffe.Net(str(path), caffe.TRAIN)


def test_the_watch_holds_the_statistics_not_the_weights(train_net):
    watched = {id(blob) for _, blob in train_net._buffer_watch}
    assert watched == {id(b) for b in train_net.params["bn"]}
    assert not watched & {id(b) for b in train_net.params["conv"]}


def _expected_stats(x: np.ndarray, before: list[np.ndarray]) -> list[np.ndarray]:
    m = x.shape[0] * x.shape[2] * x.shape[3]
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3)) * m / (m - 1)
    return [before[0] * 0.999 + mean, before[1] * 0.999 + var, before[2] * 0.999 + 1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU mode needs CUDA")
def test_statistics_a_gpu_forward_updates_reach_the_host_view(train_net):
    caffe.set_mode_gpu()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    before = [b.data.copy() for b in train_net.params["bn"]]
    train_net.blobs["x"].data[...] = x
    train_net.forward()
    want = _expected_stats(x, before)
    for blob, expected in zip(train_net.params["bn"], want):
        np.testing.assert_allclose(blob.data, expected, rtol=1e-5, atol=1e-6)
    # a host edit after the update starts from the updated values, not the loaded ones
    train_net.params["bn"][2].data[...] = 2.0
    train_net.forward()
    again = _expected_stats(x, [want[0], want[1], np.array([2.0], np.float32)])
    for blob, expected in zip(train_net.params["bn"], again):
        np.testing.assert_allclose(blob.data, expected, rtol=1e-5, atol=1e-6)


class _Untouchable(list):
    def __iter__(self):
        raise AssertionError("the buffer watch was walked")


@pytest.mark.parametrize("phase", [caffe.TRAIN, caffe.TEST])
def test_only_a_net_whose_layers_may_update_their_blobs_watches_them(
    tmp_path, meta_gpu_mode, phase
):
    """In GPU mode a TRAIN BatchNorm's forward moves its statistics' heads to the device; a
    TEST net, which the lazy forward serves and whose layers update nothing, is not walked."""
    path = tmp_path / "bn.prototxt"
    path.write_text(PROTO)
    net = caffe.Net(str(path), phase)
    net.blobs["x"].data[...] = 1.0
    net.forward()  # moves the module to the device side
    for blob in net.params["bn"]:
        blob.cpu_data()  # host sides current again
    if phase == caffe.TEST:
        net._buffer_watch = _Untouchable(net._buffer_watch)
    net.forward()
    heads = {blob.data_memory.head for blob in net.params["bn"]}
    assert heads == ({Head.HEAD_AT_GPU} if phase == caffe.TRAIN else {Head.SYNCED})


@pytest.mark.parametrize("backward", [True, False])
def test_blobs_a_script_read_on_the_host_are_rewritten_on_the_device_without_a_copy_back(
    tmp_path, meta_gpu_mode, backward
):
    """GPU mode, a training forward (and backward, where some layer needs one) while a
    script holds host views of tops and diffs it read: the pass writes every element of
    them on the device, so their host values (stale once it runs) are not copied there
    first, as ``mutable_gpu_data`` would."""
    path = tmp_path / "bn.prototxt"
    path.write_text("force_backward: true\n" * backward + PROTO)
    net = caffe.Net(str(path), caffe.TRAIN)
    blobs = net.blobs
    copies: list[tuple[syncedmem.SyncedMemory, str]] = []
    syncedmem.copy_hooks.append(lambda memory, direction: copies.append((memory, direction)))
    try:
        for _ in range(2):
            blobs["x"].data[...] = 1.0
            net.forward()
            blobs["z"].diff[...] = 1.0
            net.backward()
            read = [blobs["y"].data, blobs["z"].data, blobs["y"].diff, blobs["x"].diff]
            written = {blobs["y"].data_memory, blobs["z"].data_memory}
            written |= {blobs["y"].diff_memory, blobs["x"].diff_memory}
            copies.clear()
            net.forward()  # ``read`` holds the host views meanwhile
            blobs["z"].diff[...] = 1.0
            net.backward()
            del read
            assert [d for m, d in copies if m in written and d == "cpu->gpu"] == []
            if backward:
                assert blobs["y"].diff_memory.head is Head.HEAD_AT_GPU
    finally:
        syncedmem.copy_hooks.pop()
