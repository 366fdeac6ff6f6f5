"""BVLC's four classic notebooks as workflows on data built here (``import torchcaffe as caffe``).

00-classification (Transformer + deploy net), 01-learning-lenet (NetSpec + SGDSolver),
net_surgery (InnerProduct -> Convolution), brewing-logreg (HDF5 + NetSpec + solver).
"""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe import layers as L
from torchcaffe import params as P


def _write(path, proto):
    path.write_text(str(proto))
    return str(path)


# -- 00-classification ------------------------------------------------------------------------


def test_classification_with_transformer(tmp_path):
    skio = pytest.importorskip("skimage.io")
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, 16, 16]))
    n.conv1 = L.Convolution(n.data, num_output=6, kernel_size=3, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.conv1, in_place=True)
    n.pool1 = L.Pooling(n.relu1, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    n.fc = L.InnerProduct(n.pool1, num_output=4, weight_filler=dict(type="xavier"))
    n.prob = L.Softmax(n.fc)
    deploy = _write(tmp_path / "deploy.prototxt", n.to_proto())
    net = caffe.Net(deploy, caffe.TEST)
    weights = str(tmp_path / "w.caffemodel")
    net.save(weights)
    net = caffe.Net(deploy, weights, caffe.TEST)

    rng = np.random.default_rng(0)
    image_path = str(tmp_path / "cat.png")
    skio.imsave(image_path, (rng.random((40, 30, 3)) * 255).astype(np.uint8), check_contrast=False)
    mu = np.array([104.0, 117.0, 123.0])
    transformer = caffe.io.Transformer({"data": net.blobs["data"].data.shape})
    transformer.set_transpose("data", (2, 0, 1))
    transformer.set_mean("data", mu)
    transformer.set_raw_scale("data", 255)
    transformer.set_channel_swap("data", (2, 1, 0))
    net.blobs["data"].reshape(5, 3, 16, 16)
    image = caffe.io.load_image(image_path)
    transformed = transformer.preprocess("data", image)
    net.blobs["data"].data[...] = transformed
    probs = net.forward()["prob"]
    assert probs.shape == (5, 4)
    np.testing.assert_allclose(probs.sum(1), 1, rtol=1e-5)
    # the same image five times: the same class each time; deprocess gives the image back
    assert len(set(probs.argmax(1))) == 1
    back = transformer.deprocess("data", net.blobs["data"].data[0])
    np.testing.assert_allclose(back, caffe.io.resize_image(image, (16, 16)), atol=1e-4)
    # layer-by-layer inspection as the notebook does
    assert [(k, v.data.shape) for k, v in net.blobs.items()][1] == ("conv1", (5, 6, 14, 14))
    assert net.params["conv1"][0].data.shape == (6, 3, 3, 3)


# -- shared: synthetic digits as HDF5 --------------------------------------------------------


def _bars(n, size, rng):
    """Two classes: a horizontal (0) or vertical (1) bar, with noise."""
    x = rng.normal(0, 0.1, (n, 1, size, size)).astype(np.float32)
    y = rng.integers(0, 2, n)
    for i in range(n):
        k = rng.integers(1, size - 1)
        if y[i]:
            x[i, 0, :, k] += 1
        else:
            x[i, 0, k, :] += 1
    return x, y.astype(np.float32)


def _hdf5(tmp_path, name, x, y):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / f"{name}.h5"
    with h5py.File(path, "w") as f:
        f["data"] = x
        f["label"] = y
    listing = tmp_path / f"{name}.txt"
    listing.write_text(f"{path}\n")
    return str(listing)


def _solver(tmp_path, train, test, **extra):
    text = (
        f'train_net: "{train}"\ntest_net: "{test}"\ntest_iter: 4\ntest_interval: 1000\n'
        'base_lr: 0.05\nmomentum: 0.9\nweight_decay: 0.0005\nlr_policy: "fixed"\n'
        "display: 0\nmax_iter: 1000\nsnapshot: 0\n"
        f'snapshot_prefix: "{tmp_path}/snap"\nrandom_seed: 1701\n'
    ) + "".join(f"{k}: {v}\n" for k, v in extra.items())
    path = tmp_path / "solver.prototxt"
    path.write_text(text)
    return str(path)


# -- 01-learning-lenet ------------------------------------------------------------------------


def lenet(source, batch_size):
    n = caffe.NetSpec()
    n.data, n.label = L.HDF5Data(batch_size=batch_size, source=source, ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=3, num_output=8, weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=3, num_output=8, weight_filler=dict(type="xavier"))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 = L.InnerProduct(n.pool2, num_output=20, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=2, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    return n.to_proto()


def test_learning_lenet_with_netspec_and_sgd(tmp_path):
    rng = np.random.default_rng(0)
    train_src = _hdf5(tmp_path, "train", *_bars(256, 14, rng))
    test_src = _hdf5(tmp_path, "test", *_bars(64, 14, rng))
    train = _write(tmp_path / "lenet_train.prototxt", lenet(train_src, 32))
    test = _write(tmp_path / "lenet_test.prototxt", lenet(test_src, 16))
    solver = caffe.SGDSolver(_solver(tmp_path, train, test))
    assert [(k, v.data.shape) for k, v in solver.net.blobs.items()][0] == ("data", (32, 1, 14, 14))
    solver.net.forward()
    solver.test_nets[0].forward()
    first = float(solver.net.blobs["loss"].data)
    losses = []
    for _ in range(60):
        solver.step(1)
        losses.append(float(solver.net.blobs["loss"].data))
    assert np.mean(losses[-10:]) < 0.5 * first
    # the notebook's manual test loop: share weights, count correct
    correct = 0
    for _ in range(4):
        solver.test_nets[0].forward()
        scores = solver.test_nets[0].blobs["score"].data
        labels = solver.test_nets[0].blobs["label"].data
        correct += int((scores.argmax(1) == labels).sum())
    assert correct / 64 > 0.9
    assert solver.net.params["conv1"][0].diff.shape == (8, 1, 3, 3)


# -- net_surgery -----------------------------------------------------------------------------


def test_net_surgery_fully_convolutional(tmp_path):
    def net(fc_conv):
        n = caffe.NetSpec()
        side = 12 if fc_conv else 8
        n.data = L.Input(shape=dict(dim=[1, 2, side, side]))
        n.conv = L.Convolution(
            n.data, num_output=3, kernel_size=3, weight_filler=dict(type="xavier")
        )
        n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=2, stride=2)  # 8x8 -> 3x3
        if fc_conv:
            n["fc-conv"] = L.Convolution(n.pool, num_output=5, kernel_size=3)
        else:
            n.fc = L.InnerProduct(n.pool, num_output=5, weight_filler=dict(type="xavier"))
        return _write(tmp_path / f"net{int(fc_conv)}.prototxt", n.to_proto())

    full = caffe.Net(net(False), caffe.TEST)
    weights = str(tmp_path / "full.caffemodel")
    full.save(weights)
    conv = caffe.Net(net(True), weights, caffe.TEST)  # copies "conv" by name; fc-conv is new
    np.testing.assert_array_equal(conv.params["conv"][0].data, full.params["conv"][0].data)
    assert full.params["fc"][0].data.shape == (5, 27)
    assert conv.params["fc-conv"][0].data.shape == (5, 3, 3, 3)
    conv.params["fc-conv"][0].data.flat = full.params["fc"][0].data.flat
    conv.params["fc-conv"][1].data[...] = full.params["fc"][1].data
    surgery = str(tmp_path / "surgery.caffemodel")
    conv.save(surgery)
    conv = caffe.Net(net(True), surgery, caffe.TEST)

    image = np.random.default_rng(0).standard_normal((1, 2, 12, 12)).astype(np.float32)
    conv.blobs["data"].data[...] = image
    heat = conv.forward()["fc-conv"]
    assert heat.shape == (1, 5, 3, 3)  # a 3x3 map of classifier outputs (stride 2)
    for i, j in [(0, 0), (1, 1), (0, 2), (2, 1)]:
        full.blobs["data"].data[...] = image[:, :, 2 * i : 2 * i + 8, 2 * j : 2 * j + 8]
        np.testing.assert_allclose(full.forward()["fc"][0], heat[0, :, i, j], rtol=1e-4, atol=1e-5)


# -- brewing-logreg --------------------------------------------------------------------------


def logreg(source, batch_size):
    n = caffe.NetSpec()
    n.data, n.label = L.HDF5Data(batch_size=batch_size, source=source, ntop=2)
    n.ip1 = L.InnerProduct(n.data, num_output=2, weight_filler=dict(type="xavier"))
    n.accuracy = L.Accuracy(n.ip1, n.label)
    n.loss = L.SoftmaxWithLoss(n.ip1, n.label)
    return n.to_proto()


def test_logistic_regression_on_hdf5(tmp_path):
    rng = np.random.default_rng(1)
    w = rng.standard_normal(4)

    def make(n):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        return x, (x @ w > 0).astype(np.float32)

    train = _write(tmp_path / "train.prototxt", logreg(_hdf5(tmp_path, "tr", *make(400)), 10))
    test = _write(tmp_path / "test.prototxt", logreg(_hdf5(tmp_path, "te", *make(100)), 25))
    solver = caffe.get_solver(_solver(tmp_path, train, test, solver_type="SGD"))
    solver.step(200)
    accuracy = np.mean([float(solver.test_nets[0].forward()["accuracy"]) for _ in range(4)])
    assert accuracy > 0.9
    # the learned direction matches the generating one
    learned = solver.net.params["ip1"][0].data
    direction = learned[1] - learned[0]
    cos = direction @ w / (np.linalg.norm(direction) * np.linalg.norm(w))
    assert cos > 0.9
