"""``Net.share_with`` as Caffe's ShareTrainedLayersWith: the target's param blobs take the
source's *data* memory (Blob::ShareData) and keep their own diffs."""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe as caffe

NET = """
name: "share"
force_backward: true
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 3 dim: 4 } shape { dim: 3 dim: 2 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.7 }
                              bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.7 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

# conv -> BatchNorm -> Scale: a TEST net folds these into the convolution's weights
FOLDED = """
name: "folded"
input: "data" input_shape { dim: 2 dim: 3 dim: 5 dim: 5 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3
                            weight_filler { type: "gaussian" std: 1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "sc" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }
"""


@pytest.fixture
def prototxt(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    return str(path)


def _fill(net, rng):
    net.blobs["data"].data[...] = rng.standard_normal((3, 4))
    net.blobs["label"].data[...] = rng.standard_normal((3, 2))


def test_each_net_keeps_its_own_diffs(prototxt):
    rng = np.random.default_rng(0)
    a, b = caffe.Net(prototxt, caffe.TRAIN), caffe.Net(prototxt, caffe.TRAIN)
    b.share_with(a)
    assert np.shares_memory(a.params["ip1"][0].data, b.params["ip1"][0].data)
    _fill(b, rng)
    b.forward()
    b.backward()
    assert np.abs(b.params["ip1"][0].diff).sum() > 0
    np.testing.assert_array_equal(a.params["ip1"][0].diff, 0)  # Caffe: ShareData only
    a.params["ip2"][0].diff[...] = 7
    assert not (b.params["ip2"][0].diff == 7).any()


def test_the_sharing_nets_solver_updates_the_shared_data(prototxt, tmp_path):
    spec = tmp_path / "solver.prototxt"
    spec.write_text(
        f'net: "{prototxt}"\nbase_lr: 0.5\nlr_policy: "fixed"\nmax_iter: 10\n'
        f'snapshot_after_train: false\nsnapshot_prefix: "{tmp_path}/s"\n'
    )
    sa, sb = caffe.SGDSolver(str(spec)), caffe.SGDSolver(str(spec))
    sb.net.share_with(sa.net)
    rng = np.random.default_rng(1)
    _fill(sb.net, rng)
    before = sa.net.params["ip1"][0].data.copy()
    sb.net.clear_param_diffs()
    sb.net.forward()
    sb.net.backward()
    grad = sb.net.params["ip1"][0].diff.copy()
    sb.apply_update()
    # Caffe: sb's Update writes data -= lr * diff into the memory both nets use
    np.testing.assert_allclose(sa.net.params["ip1"][0].data, before - 0.5 * grad, rtol=1e-6)
    np.testing.assert_array_equal(sb.net.params["ip1"][0].data, sa.net.params["ip1"][0].data)


def test_a_write_through_one_net_reaches_the_others_folded_forward(tmp_path):
    path = tmp_path / "folded.prototxt"
    path.write_text(FOLDED)
    a, b = caffe.Net(str(path), caffe.TEST), caffe.Net(str(path), caffe.TEST)
    for net in (a, b):
        net.params["bn"][0].data[...] = 0.5
        net.params["bn"][1].data[...] = 2
        net.params["bn"][2].data[...] = 1
    x = np.random.default_rng(2).standard_normal((2, 3, 5, 5)).astype(np.float32)
    b.share_with(a)
    b.forward(data=x)
    a.params["conv"][0].data[...] *= 2
    a.params["sc"][0].data[...] = 3
    expected = a.forward(data=x)["ip"].copy()
    np.testing.assert_allclose(b.forward(data=x)["ip"], expected, rtol=1e-5)
    b.params["ip"][0].data[...] *= -1
    np.testing.assert_allclose(a.forward(data=x)["ip"], -expected, rtol=1e-5)


def test_test_nets_share_data_but_not_diffs(prototxt, tmp_path):
    spec = tmp_path / "solver.prototxt"
    spec.write_text(
        f'net: "{prototxt}"\ntest_net: "{prototxt}"\ntest_iter: 1\ntest_interval: 1\n'
        f'base_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 10\nsnapshot_after_train: false\n'
        f'snapshot_prefix: "{tmp_path}/s"\n'
    )
    solver = caffe.SGDSolver(str(spec))
    solver.step(2)
    test = solver.test_nets[0]
    view = test.params["ip1"][0]
    solver.step(1)
    assert test.params["ip1"][0] is view  # an unchanged share keeps the Blobs
    np.testing.assert_array_equal(view.data, solver.net.params["ip1"][0].data)
    assert not np.shares_memory(view.diff, solver.net.params["ip1"][0].diff)


def test_a_param_blob_held_before_the_share_follows_it(prototxt):
    """A script's ``w = net.params[...][0]`` (or ``net.layers[i]``) from before share_with is
    the same Blob afterwards, now over the shared memory, as Caffe's ShareData keeps the Blob
    and swaps its memory; it was a stale Blob whose write raised a KeyError."""
    a, b = caffe.Net(prototxt, caffe.TRAIN), caffe.Net(prototxt, caffe.TRAIN)
    held, layer = b.params["ip1"][0], b.layers[1]
    b.share_with(a)
    assert b.params["ip1"][0] is held and layer.blobs[0] is held
    np.testing.assert_array_equal(held.data, a.params["ip1"][0].data)
    held.data[...] = 3
    np.testing.assert_array_equal(a.params["ip1"][0].data, 3)
    _fill(b, np.random.default_rng(0))
    b.forward()
    b.backward()
    assert np.abs(held.diff).sum() > 0
    np.testing.assert_array_equal(a.params["ip1"][0].diff, 0)


# two layers named "ip" (Caffe allows it; NetTest's TrickyNet has two 'innerproduct' layers)
SAME_NAMES = """
name: "same_names"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "a"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "a" top: "b"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 } } }
"""


def test_layers_sharing_a_name_share_as_caffe_walks_them(tmp_path):
    # ShareTrainedLayersWith walks the source's layers and shares each into the target's
    # first layer of that name: the later source wins there, the later target keeps its own
    path = tmp_path / "net.prototxt"
    path.write_text(SAME_NAMES)
    source, target = caffe.Net(str(path), caffe.TEST), caffe.Net(str(path), caffe.TEST)
    own = [b.data.copy() for b in target.layers[2].blobs]
    target.share_with(source)
    for mine, theirs in zip(target.layers[1].blobs, source.layers[2].blobs):
        np.testing.assert_array_equal(mine.data, theirs.data)
    for blob, kept in zip(target.layers[2].blobs, own):
        np.testing.assert_array_equal(blob.data, kept)
    source.layers[2].blobs[0].data[...] = 3.0  # shared memory: the write shows in the target
    assert (target.layers[1].blobs[0].data == 3.0).all()
