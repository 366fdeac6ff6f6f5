"""A Python layer's learnable blobs in a pycaffe Net, as Caffe's Net and Solver treat them.

Expected values follow BVLC Caffe: a layer's ``blobs`` are the net's params (Net::AppendParam),
so the class's ``backward`` writes the param diffs themselves. Net::Backward does not clear
them (Solver::Step's ClearParamDiffs does), so a diff the class sets replaces the one left by
an earlier backward, and one it adds to grows, as C++ layers' diffs grow.
"""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
import torch

import torchcaffe as caffe

MODULE = """
import torchcaffe as caffe

class ScaleSets(caffe.Layer):
    # top = w * bottom; backward sets w's diff
    def setup(self, bottom, top):
        self.blobs.add_blob(bottom[0].channels)
        self.blobs[0].data[...] = float(self.param_str or 0.5)
        self.seen = []
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)
    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * self.blobs[0].data
    def backward(self, top, propagate_down, bottom):
        self.seen.append(self.blobs[0].diff.copy())
        self.blobs[0].diff[...] = (top[0].diff * bottom[0].data).sum(0)
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff * self.blobs[0].data

class ScaleAdds(ScaleSets):
    # backward adds to w's diff, as Caffe's C++ layers do
    def backward(self, top, propagate_down, bottom):
        self.seen.append(self.blobs[0].diff.copy())
        self.blobs[0].diff[...] += (top[0].diff * bottom[0].data).sum(0)
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff * self.blobs[0].data

class HoldsViews(caffe.Layer):
    # keeps numpy views of its blob's data and diff from setup
    def setup(self, bottom, top):
        self.blobs.add_blob(bottom[0].channels)
        self.w, self.w_diff = self.blobs[0].data, self.blobs[0].diff
        self.w[...] = 0.5
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)
    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * self.w
    def backward(self, top, propagate_down, bottom):
        self.w_diff[...] = (top[0].diff * bottom[0].data).sum(0)
"""


@pytest.fixture
def pymodule(tmp_path, monkeypatch):
    (tmp_path / "tc_param_layers.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("tc_param_layers", None)


def _python(name, cls, bottom, top, extra=""):
    return (
        f'layer {{ name: "{name}" type: "Python" bottom: "{bottom}" top: "{top}" '
        f'python_param {{ module: "tc_param_layers" layer: "{cls}" }} {extra}}}\n'
    )


def _net(tmp_path, layers):
    path = tmp_path / "net.prototxt"
    text = 'name: "pyparams" force_backward: true input: "x" input_shape { dim: 2 dim: 3 }\n'
    path.write_text(text + textwrap.dedent(layers))
    return caffe.Net(str(path), caffe.TRAIN, allow_python_layers=True)


X = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
TOP_DIFF = np.array([[1.0, -1.0, 2.0], [0.5, 3.0, -2.0]], np.float32)
GRAD = (TOP_DIFF * X).sum(0)  # d(sum(top_diff * w * x))/dw


def _backward_twice(net, layer):
    net.blobs["x"].data[...] = X
    for _ in range(2):
        net.forward()
        net.blobs[layer].diff[...] = TOP_DIFF
        net.backward()


@pytest.mark.parametrize("cls, after_two", [("ScaleSets", GRAD), ("ScaleAdds", 2 * GRAD)])
def test_backward_writes_the_param_diff_itself(pymodule, tmp_path, cls, after_two):
    """Two backwards without clearing: a set diff stays, an added one doubles."""
    net = _net(tmp_path, _python("s", cls, "x", "s"))
    _backward_twice(net, "s")
    np.testing.assert_array_equal(net.params["s"][0].diff, after_two)
    layer = net.layer_dict["s"]
    np.testing.assert_array_equal(layer.blobs[0].diff, after_two)  # the same blob in Caffe
    np.testing.assert_array_equal(layer.seen[0], np.zeros(3))
    np.testing.assert_array_equal(layer.seen[1], GRAD)  # what the first backward left


def test_shared_param_diff_is_the_last_writers(pymodule, tmp_path):
    """``param { name }`` shares one blob; Net::Backward runs "b" then "a", and "a" sets it."""
    shared = 'param { name: "w" }'
    net = _net(
        tmp_path,
        _python("a", "ScaleSets", "x", "a", shared) + _python("b", "ScaleSets", "a", "b", shared),
    )
    net.blobs["x"].data[...] = X
    net.forward()
    net.blobs["b"].diff[...] = TOP_DIFF
    net.backward()
    a_top_diff = TOP_DIFF * 0.5  # b's bottom diff: top diff * w
    np.testing.assert_array_equal(net.params["a"][0].diff, (a_top_diff * X).sum(0))
    np.testing.assert_array_equal(net.layer_dict["a"].seen[0], (TOP_DIFF * X * 0.5).sum(0))


def test_views_kept_from_setup_are_the_params(pymodule, tmp_path):
    """Caffe copies loaded weights and updates into the layer's blobs' memory, so a view
    the layer took in setup shows them, and its diff writes are the param's diff."""
    net = _net(tmp_path, _python("h", "HoldsViews", "x", "h"))
    net.params["h"][0].data[...] = [1.0, 2.0, 3.0]
    net.blobs["x"].data[...] = X
    np.testing.assert_array_equal(net.forward()["h"], X * [1.0, 2.0, 3.0])
    net.blobs["h"].diff[...] = TOP_DIFF
    net.backward()
    np.testing.assert_array_equal(net.params["h"][0].diff, GRAD)


def test_views_kept_from_setup_see_solver_updates(pymodule, tmp_path):
    net_path = tmp_path / "net.prototxt"
    net_path.write_text(
        'name: "pyparams" input: "x" input_shape { dim: 2 dim: 3 }\n'
        'input: "y" input_shape { dim: 2 dim: 3 }\n'
        + _python("h", "HoldsViews", "x", "h")
        + 'layer { name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "y" top: "loss" }\n'
    )
    solver_path = tmp_path / "solver.prototxt"
    solver_path.write_text(f'net: "{net_path}" base_lr: 0.1 lr_policy: "fixed"\n')
    solver = caffe.SGDSolver(str(solver_path), allow_python_layers=True)
    solver.net.blobs["x"].data[...] = X
    solver.net.blobs["y"].data[...] = 0
    solver.step(1)
    w = np.float32(0.5) - np.float32(0.1) * ((X * 0.5 / 2) * X).sum(0, dtype=np.float32)
    np.testing.assert_allclose(solver.net.params["h"][0].data, w, rtol=1e-6)
    np.testing.assert_array_equal(solver.net.layer_dict["h"].w, solver.net.params["h"][0].data)
    solver.net.forward()
    np.testing.assert_allclose(solver.net.blobs["h"].data, X * w, rtol=1e-6)


def test_torch_face_view_kept_from_setup_reads_the_parameter(pymodule, tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text('name: "t" input: "x" input_shape { dim: 2 dim: 3 }\n')
    path.write_text(path.read_text() + _python("h", "HoldsViews", "x", "h"))
    tnet = caffe.load(str(path), allow_python_layers=True)
    with torch.no_grad():
        tnet.layer("h").blob0.fill_(3.0)
    torch.testing.assert_close(tnet(x=torch.ones(2, 3))["h"], torch.full((2, 3), 3.0))
