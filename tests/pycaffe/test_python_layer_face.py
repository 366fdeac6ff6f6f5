"""Python layers as pycaffe's test_python_layer.py checks them (``import torchcaffe as caffe``)."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe.errors import LayerParamError
from torchcaffe.trust import allow_python_layers

MODULE = """
import torchcaffe as caffe

class SimpleLayer(caffe.Layer):
    def setup(self, bottom, top):
        pass
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)
    def forward(self, bottom, top):
        top[0].data[...] = 10 * bottom[0].data
    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = 10 * top[0].diff

class ExceptionLayer(caffe.Layer):
    def setup(self, bottom, top):
        raise RuntimeError("boom in setup")

class KeyErrorLayer(SimpleLayer):
    def setup(self, bottom, top):
        raise KeyError("missing")

class ForwardFails(SimpleLayer):
    def forward(self, bottom, top):
        raise ValueError("bad forward")

class BackwardFails(SimpleLayer):
    def backward(self, top, propagate_down, bottom):
        raise ZeroDivisionError("bad backward")

class ParameterLayer(caffe.Layer):
    def setup(self, bottom, top):
        self.blobs.add_blob(1)
        self.blobs[0].data[0] = 0
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)
    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data + self.blobs[0].data
    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] = 1

class PhaseLayer(caffe.Layer):
    def setup(self, bottom, top):
        pass
    def reshape(self, bottom, top):
        top[0].reshape()
    def forward(self, bottom, top):
        top[0].data[()] = self.phase
"""


@pytest.fixture
def pymodule(tmp_path, monkeypatch):
    (tmp_path / "tc_pylayers.py").write_text(MODULE)
    (tmp_path / "tc_broken.py").write_text("def f(:\n    pass\n")
    (tmp_path / "tc_tabs.py").write_text("if True:\n        x = 1\n\ty = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("tc_pylayers", "tc_broken", "tc_tabs"):
        sys.modules.pop(name, None)


def _net(tmp_path, layers, phase=caffe.TEST, shape=(10, 9, 8)):
    dims = " ".join(f"dim: {d}" for d in shape)
    text = f'name: "pythonnet" input: "data" input_shape {{ {dims} }}\n' + textwrap.dedent(layers)
    path = tmp_path / "net.prototxt"
    path.write_text(text)
    with allow_python_layers(True):
        return caffe.Net(str(path), phase), str(path)


def _layer(name, bottom, top, cls, module="tc_pylayers"):
    return (
        f'layer {{ name: "{name}" type: "Python" bottom: "{bottom}" top: "{top}" '
        f'python_param {{ module: "{module}" layer: "{cls}" }} }}\n'
    )


def _simple(tmp_path):
    layers = (
        _layer("one", "data", "one", "SimpleLayer")
        + _layer("two", "one", "two", "SimpleLayer")
        + _layer("three", "two", "three", "SimpleLayer")
    )
    return _net(tmp_path, "force_backward: true\n" + layers)[0]


def test_forward(pymodule):
    net = _simple(pymodule)
    x = 8
    net.blobs["data"].data[...] = x
    net.forward()
    assert np.all(net.blobs["three"].data == 10**3 * x)


def test_backward(pymodule):
    net = _simple(pymodule)
    x = 7
    net.blobs["three"].diff[...] = x
    net.backward()
    assert np.all(net.blobs["data"].diff == 10**3 * x)


def test_reshape(pymodule):
    net = _simple(pymodule)
    s = 4
    net.blobs["data"].reshape(s, s, s, s)
    net.forward()
    for blob in net.blobs.values():
        assert blob.data.shape == (s, s, s, s)


def test_exception_in_setup_keeps_its_type_and_names_the_layer(pymodule):
    with pytest.raises(RuntimeError, match="boom in setup") as info:
        _net(pymodule, _layer("layer", "data", "top", "ExceptionLayer"))
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "layer 'layer'" in notes and "ExceptionLayer" in notes and "net.prototxt" in notes


def test_key_error_in_setup_keeps_its_type(pymodule):
    with pytest.raises(KeyError) as info:
        _net(pymodule, _layer("kl", "data", "top", "KeyErrorLayer"))
    assert "layer 'kl'" in " ".join(info.value.__notes__)


def test_exceptions_in_forward_and_backward_keep_their_types(pymodule):
    net, path = _net(
        pymodule,
        "force_backward: true\n"
        + _layer("f", "data", "f", "ForwardFails")
        + _layer("b", "data", "b", "BackwardFails"),
    )
    with pytest.raises(ValueError, match="bad forward") as info:
        net.forward()
    assert any("layer 'f'" in n and path in n for n in info.value.__notes__)
    net2, _ = _net(pymodule, "force_backward: true\n" + _layer("b", "data", "b", "BackwardFails"))
    net2.forward()
    with pytest.raises(ZeroDivisionError, match="bad backward") as info2:
        net2.backward()
    assert any("layer 'b'" in n and "raised in backward" in n for n in info2.value.__notes__)


@pytest.mark.parametrize("module,kind", [("tc_broken", "SyntaxError"), ("tc_tabs", "TabError")])
def test_module_that_fails_to_import_names_layer_and_file(pymodule, module, kind):
    with pytest.raises(LayerParamError) as info:
        _net(pymodule, _layer("bad", "data", "top", "Anything", module=module))
    msg = str(info.value)
    assert "layer 'bad'" in msg and f"{module}.py" in msg and kind in msg


def test_parameter_blobs_learn_and_save(pymodule, tmp_path):
    net, _ = _net(
        pymodule, "force_backward: true\n" + _layer("layer", "data", "top", "ParameterLayer")
    )
    assert net.params["layer"][0].data[0] == 0
    net.forward()
    net.backward()
    assert net.params["layer"][0].diff[0] == 1
    net.params["layer"][0].data[0] += 3
    weights = str(tmp_path / "p.caffemodel")
    net.save(weights)
    other, _ = _net(
        pymodule, "force_backward: true\n" + _layer("layer", "data", "top", "ParameterLayer")
    )
    other.copy_from(weights)
    assert other.params["layer"][0].data[0] == 3
    other.blobs["data"].data[...] = 1
    assert np.all(other.forward()["top"] == 4)


def test_phase(pymodule):
    for phase in (caffe.TRAIN, caffe.TEST):
        net, _ = _net(pymodule, _layer("layer", "data", "phase", "PhaseLayer"), phase=phase)
        assert net.forward()["phase"] == phase
