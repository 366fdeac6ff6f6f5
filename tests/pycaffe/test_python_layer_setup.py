"""Python layers set up and called as Caffe's Layer::SetUp and Net::Forward call them.

Expected values follow BVLC Caffe: SetUp runs ``setup`` then ``reshape`` once, each forward
runs ``reshape`` then ``forward``, the layer sees the same bottom and top Blobs in every call,
and ``net.layers[i]`` of a Python layer is the script's own layer object.
"""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
import torch

import torchcaffe as caffe
from torchcaffe.pycaffe.net import LayerView

MODULE = """
import torchcaffe as caffe

class SetupShapes(caffe.Layer):
    # pascal_multilabel_datalayers.py: tops shaped in setup, reshape a no-op
    def setup(self, bottom, top):
        top[0].reshape(2, 3)
    def reshape(self, bottom, top):
        pass
    def forward(self, bottom, top):
        top[0].data[...] = 1
    def backward(self, top, propagate_down, bottom):
        pass

class KeepsBlobs(caffe.Layer):
    # reads and writes only the Blobs it kept from setup
    def setup(self, bottom, top):
        self.bottom, self.top = bottom[0], top[0]
        self.handed = []
    def reshape(self, bottom, top):
        self.handed.append((bottom[0], top[0]))
        top[0].reshape(*bottom[0].data.shape)
    def forward(self, bottom, top):
        self.handed.append((bottom[0], top[0]))
        self.top.data[...] = self.bottom.data * 2
    def backward(self, top, propagate_down, bottom):
        self.handed.append((bottom[0], top[0]))
        self.bottom.diff[...] = self.top.diff * 2

class Counts(caffe.Layer):
    def setup(self, bottom, top):
        self.calls = {"setup": 1, "reshape": 0, "forward": 0}
    def reshape(self, bottom, top):
        self.calls["reshape"] += 1
        top[0].reshape(*bottom[0].data.shape)
    def forward(self, bottom, top):
        self.calls["forward"] += 1
        top[0].data[...] = bottom[0].data
    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = top[0].diff

class RoiData(caffe.Layer):
    # py-faster-rcnn's RoIDataLayer: the script hands it data through a method
    def setup(self, bottom, top):
        self.roidb = []
        top[0].reshape(1)
    def set_roidb(self, roidb):
        self.roidb = roidb
    def reshape(self, bottom, top):
        pass
    def forward(self, bottom, top):
        top[0].data[...] = len(self.roidb) + getattr(self, "extra", 0)
    def backward(self, top, propagate_down, bottom):
        pass

class Regroups(caffe.Layer):
    # tops shaped (2, 3) at set-up, (3, 2) from the first forward on
    def setup(self, bottom, top):
        top[0].reshape(2, 3)
    def reshape(self, bottom, top):
        pass
    def forward(self, bottom, top):
        top[0].reshape(3, 2)
        top[0].data[...] = 1
    def backward(self, top, propagate_down, bottom):
        pass

class Learns(caffe.Layer):
    def setup(self, bottom, top):
        self.blobs.add_blob(1)
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)
    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data + self.blobs[0].data
    def backward(self, top, propagate_down, bottom):
        pass
"""

INPUT = 'input: "data" input_shape { dim: 2 dim: 3 }\n'


@pytest.fixture
def pymodule(tmp_path, monkeypatch):
    (tmp_path / "tc_setup_layers.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("tc_setup_layers", None)


def _python(name, cls, bottom=None, top=None):
    bottom_field = f'bottom: "{bottom}" ' if bottom else ""
    return (
        f'layer {{ name: "{name}" type: "Python" {bottom_field}top: "{top or name}" '
        f'python_param {{ module: "tc_setup_layers" layer: "{cls}" }} }}\n'
    )


def _write(tmp_path, layers):
    path = tmp_path / "net.prototxt"
    path.write_text('name: "pysetup"\n' + textwrap.dedent(layers))
    return str(path)


def _net(tmp_path, layers, phase=caffe.TEST):
    return caffe.Net(_write(tmp_path, layers), phase, allow_python_layers=True)


IP = (
    'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
    'inner_product_param { num_output: 4 weight_filler { type: "constant" value: 1 } } }\n'
)


# -- 1: top shapes set in setup are kept ------------------------------------------------------
@pytest.mark.parametrize("phase", [caffe.TRAIN, caffe.TEST])
def test_top_shapes_from_setup_are_kept(pymodule, tmp_path, phase):
    net = _net(tmp_path, _python("py", "SetupShapes", top="x") + IP, phase)
    assert net.blobs["x"].shape == (2, 3)
    assert net.blobs["y"].shape == (2, 4)
    net.forward()
    np.testing.assert_array_equal(net.blobs["x"].data, np.ones((2, 3)))
    np.testing.assert_array_equal(net.blobs["y"].data, np.full((2, 4), 3.0))  # 3 ones summed


@pytest.mark.parametrize("min_weights", [0, 1 << 18])  # on oneDNN's product, and on torch's
def test_a_top_regrouped_at_run_time_is_refused_by_inner_product(
    pymodule, tmp_path, monkeypatch, min_weights
):
    """Caffe's InnerProduct Reshape, run on every forward, stops when the count from its axis
    changes; the (3, 2) top must not be read as two rows of 3."""
    from torchcaffe.errors import TorchCaffeError
    from torchcaffe.ops import onednn_linear

    monkeypatch.setattr(onednn_linear, "MIN_WEIGHTS", min_weights)
    net = _net(tmp_path, _python("py", "Regroups", top="x") + IP)
    with pytest.raises(TorchCaffeError, match="incompatible with inner product"):
        net.forward()


def test_net_reshape_keeps_the_shapes_setup_gave(pymodule, tmp_path):
    """Net::Reshape calls Reshape on the layer's blobs; a no-op leaves them as they are."""
    net = _net(tmp_path, _python("py", "SetupShapes", top="x") + IP)
    net.reshape()
    assert net.blobs["x"].shape == (2, 3)
    assert net.blobs["y"].shape == (2, 4)


def test_torch_face_keeps_the_shapes_setup_gave(pymodule, tmp_path):
    tnet = caffe.load(
        _write(tmp_path, _python("py", "SetupShapes", top="x") + IP), allow_python_layers=True
    )
    assert tnet.blob_shapes["x"] == (2, 3)
    torch.testing.assert_close(tnet()["y"], torch.full((2, 4), 3.0))


def test_torch_face_bottomless_layer_tops_follow_the_net_dtype(pymodule, tmp_path):
    """A Python data layer's tops take the net's dtype, as its native data layers' do, so
    the layers it feeds get inputs of their params' dtype after ``.double()``."""
    tnet = caffe.load(
        _write(tmp_path, _python("py", "SetupShapes", top="x") + IP), allow_python_layers=True
    ).double()
    blobs = tnet.forward_all_blobs()
    assert blobs["x"].dtype == blobs["y"].dtype == torch.float64
    torch.testing.assert_close(blobs["y"], torch.full((2, 4), 3.0, dtype=torch.float64))


# -- 2: bottoms kept from setup see each call's data ------------------------------------------
@pytest.mark.parametrize("phase", [caffe.TRAIN, caffe.TEST])
def test_bottom_kept_from_setup_reads_each_forward_data(pymodule, tmp_path, phase):
    net = _net(
        tmp_path, "force_backward: true\n" + INPUT + _python("k", "KeepsBlobs", "data"), phase
    )
    for value in (3.0, 5.0):
        net.blobs["data"].data[...] = value
        np.testing.assert_array_equal(net.forward()["k"], np.full((2, 3), 2 * value))


def test_bottom_kept_from_setup_gets_the_diff(pymodule, tmp_path):
    net = _net(
        tmp_path,
        "force_backward: true\n" + INPUT + _python("k", "KeepsBlobs", "data"),
        caffe.TRAIN,
    )
    net.blobs["data"].data[...] = 1
    net.forward()
    net.blobs["k"].diff[...] = 4
    net.backward()
    np.testing.assert_array_equal(net.blobs["data"].diff, np.full((2, 3), 8.0))


def test_layer_is_handed_the_same_blobs_in_every_call(pymodule, tmp_path):
    net = _net(
        tmp_path,
        "force_backward: true\n" + INPUT + _python("k", "KeepsBlobs", "data"),
        caffe.TRAIN,
    )
    net.forward()
    net.backward()
    net.forward()
    layer = net.layer_dict["k"]
    assert len(layer.handed) == 6  # reshape at set-up; reshape, forward, backward; twice more
    assert all(b is layer.bottom and t is layer.top for b, t in layer.handed)


def test_torch_face_bottom_kept_from_setup(pymodule, tmp_path):
    tnet = caffe.load(
        _write(tmp_path, INPUT + _python("k", "KeepsBlobs", "data")), allow_python_layers=True
    )
    x = torch.full((2, 3), 3.0, requires_grad=True)
    out = tnet(data=x)["k"]
    torch.testing.assert_close(out, torch.full((2, 3), 6.0))
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2, 3), 2.0))


# -- 3: net.layers holds the script's own layer object ----------------------------------------
def test_net_layers_is_the_python_layers_own_object(pymodule, tmp_path):
    net = _net(tmp_path, _python("roi", "RoiData", top="x"), caffe.TRAIN)
    layer = net.layers[0]
    assert type(layer).__name__ == "RoiData" and isinstance(layer, caffe.Layer)
    assert net.layer_dict["roi"] is layer
    assert layer.type == "Python" and list(layer.blobs) == []
    layer.set_roidb([1, 2, 3])  # py-faster-rcnn: solver.net.layers[0].set_roidb(roidb)
    assert net.forward()["x"] == 3
    layer.extra = 10  # an attribute the script sets is the layer's own
    assert net.forward()["x"] == 13


def test_solver_net_layers_reach_the_python_layer(pymodule, tmp_path):
    net_path = _write(tmp_path, _python("roi", "RoiData", top="x"))
    solver_path = tmp_path / "solver.prototxt"
    solver_path.write_text(f'net: "{net_path}"\nbase_lr: 0.1\nlr_policy: "fixed"\n')
    solver = caffe.SGDSolver(str(solver_path), allow_python_layers=True)
    solver.net.layers[0].set_roidb(["a", "b"])
    solver.net.forward()
    assert solver.net.blobs["x"].data[0] == 2


def test_python_layer_blobs_are_its_params(pymodule, tmp_path):
    net = _net(tmp_path, INPUT + _python("p", "Learns", "data"))
    layer = net.layer_dict["p"]
    assert len(layer.blobs) == 1  # the layer's own self.blobs, on the param's memory
    net.params["p"][0].data[...] = 7
    assert layer.blobs[0].data[0] == 7
    net.blobs["data"].data[...] = 1
    np.testing.assert_array_equal(net.forward()["p"], np.full((2, 3), 8.0))


def test_other_layers_stay_views(pymodule, tmp_path):
    net = _net(tmp_path, _python("py", "SetupShapes", top="x") + IP)
    view = net.layer_dict["ip"]
    assert isinstance(view, LayerView) and net.layers[1] is view
    assert view.type == "InnerProduct" and view.blobs[0].data.shape == (4, 3)
    assert list(net.params) == ["ip"]
    top = caffe.Blob()
    view.reshape([net.blobs["x"]], [top])
    assert top.shape == (2, 4)


# -- 4: reshape runs once at set-up and once per forward --------------------------------------
@pytest.mark.parametrize("phase", [caffe.TRAIN, caffe.TEST])
def test_reshape_runs_once_at_setup_and_once_per_forward(pymodule, tmp_path, phase):
    net = _net(tmp_path, "force_backward: true\n" + INPUT + _python("c", "Counts", "data"), phase)
    calls = net.layer_dict["c"].calls
    assert calls == {"setup": 1, "reshape": 1, "forward": 0}
    net.forward()
    assert calls == {"setup": 1, "reshape": 2, "forward": 1}
    net.forward()
    assert calls == {"setup": 1, "reshape": 3, "forward": 2}
    net.reshape()  # Net::Reshape reshapes every layer once
    assert calls == {"setup": 1, "reshape": 4, "forward": 2}


def test_torch_face_reshape_runs_once_at_setup_and_once_per_forward(pymodule, tmp_path):
    tnet = caffe.load(
        _write(tmp_path, INPUT + _python("c", "Counts", "data")), allow_python_layers=True
    )
    calls = tnet.layer("c").py.calls
    assert calls == {"setup": 1, "reshape": 1, "forward": 0}
    for _ in range(3):  # the declared input shape: no new shape inference
        before = dict(calls)
        tnet(data=torch.ones(2, 3))
        assert calls["reshape"] == before["reshape"] + 1
        assert calls["forward"] == before["forward"] + 1
