"""Cells of BVLC's notebooks that test_notebook_workflows.py leaves out, on tiny nets.

Each test repeats one cell's pycaffe pattern and checks what Caffe itself does there
(solver.cpp's Step/Solve/Test schedule, blob memory that outlives a forward, DummyData
skipped by forward(start=...), forward_all padding a short last batch).
"""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe import layers as L
from torchcaffe import params as P


def _indexed_hdf5(tmp_path, name, n):
    """n samples whose label is their own index, so a batch tells where the cursor is."""
    h5py = pytest.importorskip("h5py")
    path = tmp_path / f"{name}.h5"
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["data"] = rng.standard_normal((n, 1, 6, 6)).astype(np.float32)
        f["label"] = np.arange(n, dtype=np.float32)
    listing = tmp_path / f"{name}.txt"
    listing.write_text(f"{path}\n")
    return str(listing)


def _lenet(source, batch_size):
    n = caffe.NetSpec()
    n.data, n.label = L.HDF5Data(batch_size=batch_size, source=source, ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=3, num_output=2, weight_filler=dict(type="xavier"))
    n.score = L.InnerProduct(n.conv1, num_output=40, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    return str(n.to_proto())


def _solver(tmp_path, test_iter=1, **fields):
    train = tmp_path / "train.prototxt"
    train.write_text(_lenet(_indexed_hdf5(tmp_path, "train", 40), 4))
    test = tmp_path / "test.prototxt"
    test.write_text(_lenet(_indexed_hdf5(tmp_path, "test", 40), 5))
    s = caffe.proto.caffe_pb2.SolverParameter()
    s.train_net = str(train)
    s.test_net.append(str(test))
    s.test_iter.append(test_iter)
    s.base_lr = 0.01
    s.lr_policy = "fixed"
    s.max_iter = 100
    s.snapshot_after_train = False
    s.snapshot_prefix = str(tmp_path / "snap")
    for key, value in fields.items():
        setattr(s, key, value)
    path = tmp_path / "solver.prototxt"
    path.write_text(str(s))
    return caffe.get_solver(str(path))


def test_learning_lenet_test_net_schedule(tmp_path):
    """01-learning-lenet: the test net holds its own filler weights until the first TestAll
    (iteration 0, test_initialization) shares the train net's; that TestAll reads test_iter
    batches; forward(start='conv1') re-scores the batch already loaded."""
    solver = _solver(tmp_path, test_iter=3, test_interval=25)
    test_net = solver.test_nets[0]
    w_test, w_train = test_net.params["conv1"][0].data, solver.net.params["conv1"][0].data
    assert not np.shares_memory(w_test, w_train)
    test_net.forward()
    np.testing.assert_array_equal(test_net.blobs["label"].data, [0, 1, 2, 3, 4])
    test_net.forward(start="conv1")
    np.testing.assert_array_equal(test_net.blobs["label"].data, [0, 1, 2, 3, 4])
    solver.step(1)
    assert np.shares_memory(test_net.params["conv1"][0].data, solver.net.params["conv1"][0].data)
    np.testing.assert_array_equal(test_net.blobs["label"].data, [15, 16, 17, 18, 19])
    np.testing.assert_array_equal(solver.net.blobs["label"].data, [0, 1, 2, 3])
    assert solver.net.blobs["loss"].data.shape == ()


def test_solve_ends_with_a_display_forward(tmp_path):
    """brewing-logreg's solver.solve(): when display divides max_iter, Solve() runs one more
    train forward to log the final loss, so the train net holds the next batch."""
    solver = _solver(tmp_path, max_iter=3, display=1, test_interval=1000)
    solver.solve()
    assert solver.iter == 3
    np.testing.assert_array_equal(solver.net.blobs["label"].data, [12, 13, 14, 15])
    solver = _solver(tmp_path, max_iter=3, display=2, test_interval=1000)
    solver.solve()
    np.testing.assert_array_equal(solver.net.blobs["label"].data, [8, 9, 10, 11])


def test_net_surgery_view_outlives_forward(tmp_path):
    """net_surgery: conv0 = net.blobs['conv'].data[0, 0] still shows the blob after a bias
    edit and another forward; params print as odict_keys, as pycaffe's OrderedDicts do."""
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 10, 10]))
    n.conv = L.Convolution(
        n.data, num_output=3, kernel_size=5, weight_filler=dict(type="gaussian", std=0.01)
    )
    path = tmp_path / "conv.prototxt"
    path.write_text(str(n.to_proto()))
    net = caffe.Net(str(path), caffe.TEST)
    assert f"{net.blobs.keys()} {net.params.keys()}" == (
        "odict_keys(['data', 'conv']) odict_keys(['conv'])"
    )
    im = np.random.default_rng(0).random((12, 14))
    net.blobs["data"].reshape(1, 1, *im.shape)
    net.blobs["data"].data[...] = im
    net.forward()
    conv0 = net.blobs["conv"].data[0, 0]
    before = conv0.copy()
    net.params["conv"][1].data[0] = 1.0
    net.forward()
    np.testing.assert_allclose(conv0, before + 1, atol=1e-6)


def test_fine_tuning_dummy_data_forward_from_conv1(tmp_path):
    """02-fine-tuning's disp_preds: a DummyData deploy net is fed by writing data[0] and
    running forward(start='conv1'); it scores as an Input net with the same weights."""

    def deploy(data):
        n = caffe.NetSpec()
        n.data = data
        n.conv1 = L.Convolution(
            n.data, kernel_size=3, num_output=4, weight_filler=dict(type="xavier")
        )
        n.pool1 = L.Pooling(n.conv1, pool=P.Pooling.MAX, kernel_size=2, stride=2)
        n.fc8 = L.InnerProduct(n.pool1, num_output=5, weight_filler=dict(type="xavier"))
        n.probs = L.Softmax(n.fc8)
        path = tmp_path / f"{type(data).__name__}{id(data)}.prototxt"
        path.write_text(str(n.to_proto()))
        return str(path)

    reference = caffe.Net(deploy(L.Input(shape=dict(dim=[1, 3, 9, 9]))), caffe.TEST)
    weights = str(tmp_path / "w.caffemodel")
    reference.save(weights)
    dummy = caffe.Net(deploy(L.DummyData(shape=dict(dim=[1, 3, 9, 9]))), weights, caffe.TEST)
    image = np.random.default_rng(1).standard_normal((3, 9, 9)).astype(np.float32)
    dummy.blobs["data"].data[0, ...] = image
    probs = dummy.forward(start="conv1")["probs"][0]
    reference.blobs["data"].data[0] = image
    np.testing.assert_allclose(probs, reference.forward()["probs"][0], rtol=1e-6)
    assert (-probs).argsort()[:5].tolist() == probs.argsort()[::-1][:5].tolist()


def test_siamese_forward_all_pads_the_last_batch(tmp_path):
    """mnist_siamese: forward_all over more samples than the batch, with a short last batch,
    gives one row per sample, each as a forward of its own batch gives it."""
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[4, 1, 5, 5]))
    n.feat = L.InnerProduct(n.data, num_output=2, weight_filler=dict(type="xavier"))
    path = tmp_path / "siamese.prototxt"
    path.write_text(str(n.to_proto()))
    net = caffe.Net(str(path), caffe.TEST)
    raw = np.random.default_rng(2).integers(0, 256, (10, 1, 5, 5)).astype(np.uint8)
    feat = net.forward_all(data=raw * 0.00390625)["feat"]
    assert feat.shape == (10, 2) and feat.dtype == np.float32
    net.blobs["data"].data[:2] = raw[8:] * 0.00390625
    np.testing.assert_allclose(feat[8:], net.forward()["feat"][:2], rtol=1e-6)
