"""An input reshaped to a size some layer cannot take is a located error in the Caffe face's
autograd forwards too (force_backward, a loss, a solver step), not a bare torch RuntimeError
from inside the layer."""

from __future__ import annotations

import pytest

import torchcaffe as caffe
from torchcaffe.errors import LayerParamError

# the upsampled pool matches the input at even sizes only (5 -> pool 3 -> deconv 6)
NET = """name: "t"
force_backward: true
layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 4 dim: 4 } } }
layer { name: "p" type: "Pooling" bottom: "data" top: "p"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "u" type: "Deconvolution" bottom: "p" top: "u"
  convolution_param { num_output: 3 kernel_size: 2 stride: 2 } }
LAYER
layer { name: "loss" type: "Reduction" bottom: "e" top: "loss" loss_weight: 1 }
"""

LAYERS = {
    "Eltwise": 'layer { name: "e" type: "Eltwise" bottom: "data" bottom: "u" top: "e" }',
    "Concat": 'layer { name: "e" type: "Concat" bottom: "data" bottom: "u" top: "e" }',
    "Reshape": 'layer { name: "e" type: "Reshape" bottom: "data" top: "e" '
    "reshape_param { shape { dim: 0 dim: 48 } } }",
    "Bias": 'layer { name: "e" type: "Bias" bottom: "data" top: "e" '
    "bias_param { axis: 1 num_axes: 3 } }",
}


@pytest.fixture
def net_file(tmp_path):
    def make(layer: str) -> str:
        path = tmp_path / "net.prototxt"
        path.write_text(NET.replace("LAYER", LAYERS[layer]))
        return str(path)

    return make


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_forward_at_a_new_input_size_names_the_layer(net_file, layer):
    path = net_file(layer)
    net = caffe.Net(path, caffe.TRAIN)
    net.forward()
    net.blobs["data"].reshape(1, 3, 5, 5)
    with pytest.raises(LayerParamError) as info:
        net.forward()
    assert info.value.path == path and info.value.layer == "e"
    assert info.value.layer_type == layer


def test_solver_step_at_a_new_input_size_names_the_layer(net_file, tmp_path):
    path = net_file("Eltwise")
    solver_file = tmp_path / "solver.prototxt"
    solver_file.write_text(f'net: "{path}"\nbase_lr: 0.1\nlr_policy: "fixed"\ndisplay: 0\n')
    solver = caffe.SGDSolver(str(solver_file))
    solver.step(1)
    solver.net.blobs["data"].reshape(1, 3, 5, 5)
    with pytest.raises(LayerParamError, match=r"layer 'e' \(Eltwise\)"):
        solver.step(1)
    assert solver.iter == 1


def test_the_good_sizes_still_run(net_file):
    net = caffe.Net(net_file("Eltwise"), caffe.TRAIN)
    net.blobs["data"].reshape(2, 3, 6, 6)
    net.forward()
    net.backward()
    assert net.blobs["e"].data.shape == (2, 3, 6, 6)


def _inputs(**shapes) -> str:
    return "".join(
        f'layer {{ name: "{n}" type: "Input" top: "{n}" input_param {{ shape {{ '
        + " ".join(f"dim: {d}" for d in s)
        + " } } }\n"
        for n, s in shapes.items()
    )


@pytest.mark.parametrize(
    "loss, b, new_a, new_b",
    [
        ("EuclideanLoss", (2, 3), (2, 4), (2, 3)),
        ("SmoothL1Loss", (2, 3), (2, 4), (2, 3)),  # checked at set-up only: a bare torch error
        ("SoftmaxWithLoss", (2,), (3, 3), (2,)),  # LossLayer::Reshape's first-dimension CHECK
    ],
)
def test_loss_at_a_new_input_size_names_the_file_and_layer(tmp_path, loss, b, new_a, new_b):
    import torch

    path = tmp_path / "loss.prototxt"
    path.write_text(
        _inputs(a=(2, 3), b=b)
        + f'layer {{ name: "loss" type: "{loss}" bottom: "a" bottom: "b" top: "loss" }}\n'
    )
    net = caffe.Net(str(path), caffe.TEST)
    net.blobs["a"].reshape(*new_a)
    net.blobs["b"].reshape(*new_b)
    with pytest.raises(LayerParamError) as info:
        net.forward()
    assert info.value.path == str(path) and info.value.layer == "loss"
    module = caffe.load(str(path))
    with pytest.raises(LayerParamError) as info:
        module(torch.zeros(new_a), torch.zeros(new_b))
    assert info.value.path == str(path) and info.value.layer == "loss"


def test_a_data_layer_top_of_a_new_size_names_the_file(tmp_path):
    """No input blob changed, so no shape inference ran: the layer's own check at run time
    names the layer, and the net adds its file."""
    import numpy as np
    from PIL import Image

    for name, side in (("a.png", 4), ("b.png", 3)):
        Image.fromarray(np.zeros((side, side, 3), np.uint8)).save(tmp_path / name)
    (tmp_path / "list.txt").write_text("a.png 0\nb.png 1\n")
    path = tmp_path / "net.prototxt"
    path.write_text(
        'layer { name: "d" type: "ImageData" top: "data" top: "label" image_data_param { '
        f'source: "{tmp_path / "list.txt"}" root_folder: "{tmp_path}/" batch_size: 1 }} }}\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
        "inner_product_param { num_output: 2 } }\n"
    )
    net = caffe.Net(str(path), caffe.TRAIN)
    net.forward()
    with pytest.raises(LayerParamError) as info:
        net.forward()
    assert info.value.path == str(path) and info.value.layer == "ip"
    module = caffe.load(str(path), phase="TRAIN")
    module()
    with pytest.raises(LayerParamError) as info:
        module()
    assert info.value.path == str(path) and info.value.layer == "ip"
