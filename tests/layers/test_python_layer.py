"""Python layers: refused without the opt-in; with it, pycaffe-style layers run forward/backward."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import torchcaffe as caffe
from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.harness import make_layer
from torchcaffe.errors import LayerParamError, TrustError, UnsupportedError
from torchcaffe.trust import ENV_VAR, allow_python_layers

AFFINE = (
    'python_param { module: "tests.helpers.python_layers" layer: "AffineLayer" '
    "param_str: \"{'w': 1.5}\" }"
)
LOSS = 'python_param { module: "tests.helpers.python_layers" layer: "EuclideanLossLayer" }'

CASES = [
    LayerCase("Python", AFFINE, [(2, 3, 4)], trusted=True, id="affine"),
    LayerCase("Python", LOSS, [(3, 4), (3, 4)], trusted=True, id="euclidean"),
]

NET = f"""
layer {{ name: "data" type: "Input" top: "x" top: "y"
        input_param {{ shape {{ dim: 3 dim: 4 }} shape {{ dim: 3 dim: 4 }} }} }}
layer {{ name: "affine" type: "Python" bottom: "x" top: "z" {AFFINE} }}
layer {{ name: "loss" type: "Python" bottom: "z" bottom: "y" top: "loss" loss_weight: 1
        {LOSS} }}
"""


def make(snippet, shapes, **kw):
    with allow_python_layers():
        return make_layer(snippet, shapes, type="Python", **kw)


def test_refused_without_opt_in(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(TrustError, match=r"layer 'layer' \(Python\).*allow_python_layers=True"):
        make_layer(AFFINE, [(2, 3)], type="Python")
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    with pytest.raises(TrustError, match=ENV_VAR):
        caffe.Net(str(path), caffe.TRAIN)


def test_opt_in_by_argument_and_by_environment(monkeypatch, tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    assert caffe.load(path, allow_python_layers=True).layer("affine").py.param_str
    monkeypatch.setenv(ENV_VAR, "1")
    assert caffe.Net(str(path), caffe.TRAIN).layer_dict["loss"].type == "Python"


def test_forward_affine_matches_numpy():
    layer, (x,) = make(AFFINE, [(2, 3, 4)])
    w, b = np.full(3, 1.5), np.arange(3) * 0.1  # from param_str and the class's setup
    want = w[None, :, None] * x.numpy() + b[None, :, None]
    np.testing.assert_allclose(layer(x).detach().numpy(), want, rtol=1e-6)
    assert [tuple(p.shape) for p in layer.param_blobs()] == [(3,), (3,)]


def test_gradient_through_user_backward():
    layer, bottoms = make(AFFINE, [(2, 3, 4)], dtype=torch.float64)
    check_layer_gradient(layer, bottoms)
    loss, bottoms = make(LOSS, [(3, 4), (3, 4)], dtype=torch.float64)
    check_layer_gradient(loss, bottoms)


def test_backward_through_two_calls_reads_each_calls_blobs():
    """Torch face: two forwards, then one backward through both. The class's backward reads
    its Blobs, which the second call refilled; each backward gets its own call's data."""
    layer, (x1,) = make(AFFINE, [(2, 3, 4)])
    x2 = torch.randn(2, 3, 4)
    x1.requires_grad_(True)
    x2.requires_grad_(True)
    want = []
    for x in (x1, x2):  # one call, one backward each
        layer(x).pow(2).sum().backward()
        want.append(x.grad.clone())
        x.grad = None
    w_grad = [p.grad.clone() for p in layer.param_blobs()]  # summed over both calls
    for p in layer.param_blobs():
        p.grad = None
    (layer(x1).pow(2).sum() + layer(x2).pow(2).sum()).backward()
    torch.testing.assert_close(x1.grad, want[0])
    torch.testing.assert_close(x2.grad, want[1])
    for p, g in zip(layer.param_blobs(), w_grad):
        torch.testing.assert_close(p.grad, g)


def test_pycaffe_net_forward_backward(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, "1")
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    net = caffe.Net(str(path), caffe.TRAIN)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    net.blobs["x"].data[...] = x
    net.blobs["y"].data[...] = y
    loss = net.forward()["loss"]
    w, b = net.params["affine"][0].data, net.params["affine"][1].data
    z = w[None] * x + b[None]
    np.testing.assert_allclose(loss, ((z - y) ** 2).sum() / 6, rtol=1e-5)
    net.backward()
    dz = (z - y) / 3
    np.testing.assert_allclose(net.blobs["z"].diff, dz, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(net.params["affine"][0].diff, (dz * x).sum(0), rtol=1e-5)
    np.testing.assert_allclose(net.params["affine"][1].diff, dz.sum(0), rtol=1e-5)
    np.testing.assert_allclose(net.blobs["x"].diff, 0)  # Input tops need no backward


IN_PLACE = """force_backward: true
layer {{ name: "data" type: "Input" top: "x" input_param {{ shape {{ dim: 2 dim: 3 }} }} }}
layer {{ name: "double" type: "Python" bottom: "x" top: "x"
        python_param {{ module: "tests.helpers.python_layers" layer: "{}" }} }}
"""


@pytest.mark.parametrize("cls", ["DoubleTopInPlaceLayer", "DoubleBottomInPlaceLayer"])
def test_an_in_place_layers_top_is_its_bottoms_blob(monkeypatch, tmp_path, cls):
    """In place, Caffe hands the layer one Blob as its bottom and its top (Net::AppendTop):
    a class may compute through either, leave the top's shape to the bottom, and find the
    top diff in the bottom's in backward. Both faces."""
    monkeypatch.setenv(ENV_VAR, "1")
    path = tmp_path / "net.prototxt"
    path.write_text(IN_PLACE.format(cls))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    g = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    net = caffe.Net(str(path), caffe.TRAIN)
    net.blobs["x"].data[...] = x
    np.testing.assert_array_equal(net.forward()["x"], 2 * x)
    net.blobs["x"].diff[...] = g
    net.backward()
    np.testing.assert_array_equal(net.blobs["x"].diff, 2 * g)
    module = caffe.load(path, phase="train")
    xt = torch.from_numpy(x).requires_grad_()
    out = module(x=xt)["x"]
    np.testing.assert_array_equal(out.detach().numpy(), 2 * x)
    out.backward(torch.from_numpy(g))
    np.testing.assert_array_equal(xt.grad.numpy(), 2 * g)


def test_params_save_and_load(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, "1")
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    a = caffe.Net(str(path), caffe.TEST)
    a.params["affine"][0].data[...] = [1, 2, 3, 4]
    a.save(str(tmp_path / "w.caffemodel"))
    b = caffe.Net(str(path), str(tmp_path / "w.caffemodel"), caffe.TEST)
    np.testing.assert_array_equal(b.params["affine"][0].data, [1, 2, 3, 4])
    b.blobs["x"].data[...] = 1
    b.forward()  # the user's forward reads the loaded blob
    np.testing.assert_allclose(b.blobs["z"].data, np.tile([1.0, 2.1, 3.2, 4.3], (3, 1)), rtol=1e-6)


def test_missing_module_and_class_are_named():
    with pytest.raises(LayerParamError, match="cannot import Python layer module 'no_such_mod'"):
        make('python_param { module: "no_such_mod" layer: "X" }', [(2, 3)])
    with pytest.raises(LayerParamError, match="has no layer class 'Missing'"):
        make('python_param { module: "tests.helpers.python_layers" layer: "Missing" }', [(2, 3)])


def test_module_missing_an_import_is_told_apart_from_a_missing_module(monkeypatch, tmp_path):
    """A pycaffe layer module that is found but cannot ``import caffe`` must not be reported
    as not on PYTHONPATH."""
    (tmp_path / "tc_wants_caffe.py").write_text("import caffe\n")
    (tmp_path / "tc_wants_dep.py").write_text("import tc_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "caffe", None)  # no caffe alias: import caffe fails
    for name in ("tc_wants_caffe", "tc_wants_dep"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(LayerParamError, match="install_caffe_alias") as info:
        make('python_param { module: "tc_wants_caffe" layer: "X" }', [(2, 3)])
    assert "tc_wants_caffe.py" in str(info.value) and "PYTHONPATH" not in str(info.value)
    with pytest.raises(LayerParamError, match="install 'tc_no_such_dependency'"):
        make('python_param { module: "tc_wants_dep" layer: "X" }', [(2, 3)])


def test_setup_failure_keeps_its_type_and_is_noted_at_the_layer():
    """pycaffe lets the layer's own exception through; a note says which layer raised it."""
    with pytest.raises(Exception, match="Need two inputs") as info:
        make(LOSS, [(3, 4)])
    assert not isinstance(info.value, LayerParamError)
    assert any("layer 'layer' (Python" in note for note in info.value.__notes__)


def test_missing_backward_is_a_clear_error():
    layer, (x,) = make(
        'python_param { module: "tests.helpers.python_layers" layer: "NoBackwardLayer" }', [(2, 3)]
    )
    x.requires_grad_(True)
    with pytest.raises(UnsupportedError, match="defines no backward"):
        layer(x).sum().backward()


def test_param_str_underscore_alias_for_py_faster_rcnn_layers():
    """py-faster-rcnn's layers read ``self.param_str_``, which its Caffe fork sets."""
    snippet = (
        'python_param { module: "tests.helpers.python_layers" layer: "ForkParamStrLayer" '
        "param_str: \"{'scale': 3.0}\" }"
    )
    layer, (x,) = make(snippet, [(2, 3)])
    assert layer.py.param_str_ == layer.py.param_str == "{'scale': 3.0}"
    np.testing.assert_allclose(layer(x).detach().numpy(), x.numpy() * 3.0)


def test_phase_is_an_int_named_as_pycaffes_enum(monkeypatch, tmp_path):
    """pycaffe's TRAIN/TEST are Boost.Python enums (str gives the name); py-faster-rcnn's
    layers look their settings up by ``cfg[str(self.phase)]``."""
    assert (str(caffe.TRAIN), str(caffe.TEST)) == ("TRAIN", "TEST")
    assert caffe.TRAIN == 0 and caffe.TEST == 1 and repr(caffe.TEST) == "caffe._caffe.Phase.TEST"
    path = tmp_path / "net.prototxt"
    path.write_text(
        'input: "x" input_shape { dim: 2 dim: 3 }\n'
        'layer { name: "p" type: "Python" bottom: "x" top: "y" python_param { '
        'module: "tests.helpers.python_layers" layer: "PhaseKeyedLayer" } }'
    )
    monkeypatch.setenv(ENV_VAR, "1")
    for phase, scale in ((caffe.TRAIN, 2.0), (caffe.TEST, 5.0)):
        net = caffe.Net(str(path), phase)
        assert net.layer_dict["p"].phase == phase
        out = net.forward(x=np.ones((2, 3), np.float32))["y"]
        np.testing.assert_allclose(out, np.full((2, 3), scale))


def test_bfloat16_net_hands_the_layer_float32_arrays(tmp_path):
    """numpy has no bfloat16: a .bfloat16() net's Python layers read and write float32
    arrays (bottoms, tops, diffs, params) and their tops come back in bfloat16."""
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    g = torch.Generator().manual_seed(2)
    x, y = (torch.randn(3, 4, generator=g).bfloat16() for _ in range(2))
    nets = [caffe.load(path, allow_python_layers=True) for _ in range(2)]
    half = nets[1].bfloat16()
    xs = [x.float().requires_grad_(True), x.clone().requires_grad_(True)]
    losses = [net(x=a, y=b)["loss"] for net, a, b in zip(nets, xs, (y.float(), y))]
    assert losses[1].dtype == torch.bfloat16
    torch.testing.assert_close(losses[1].float(), losses[0], rtol=1e-2, atol=1e-2)
    for loss in losses:
        loss.backward()
    assert xs[1].grad is not None and xs[1].grad.dtype == torch.bfloat16
    torch.testing.assert_close(xs[1].grad.float(), xs[0].grad, rtol=2e-2, atol=2e-2)
    w = dict(half.named_parameters())
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in w.values())
