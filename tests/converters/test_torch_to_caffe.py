"""PyTorch -> Caffe export: whole torchvision-style graphs and each mapped op, checked by
loading the written files back through torchcaffe (and OpenCV's Caffe importer)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchcaffe
from torchcaffe.errors import ExportError
from torchcaffe.formats.prototxt import read_net

from .torch_models import (
    VGG11,
    EfficientNetB0,
    MobileNetV2,
    ResNet18,
    ShuffleNetV2,
    randomize_batch_norm,
)

MODELS = [
    pytest.param(lambda: ResNet18(num_classes=10, width=4), 64, id="resnet18"),
    pytest.param(lambda: MobileNetV2(num_classes=10, width=4), 64, id="mobilenet_v2"),
    pytest.param(lambda: VGG11(num_classes=10, width=8), 224, id="vgg11"),
    pytest.param(lambda: ShuffleNetV2(num_classes=10, width=4), 64, id="shufflenet_v2"),
    pytest.param(lambda: EfficientNetB0(num_classes=10, width=4), 64, id="efficientnet_b0"),
]


def _export(tmp_path, module, x, **kw):
    proto, weights = tmp_path / "net.prototxt", tmp_path / "net.caffemodel"
    torchcaffe.export(module, x, proto, weights, **kw)
    return proto, weights


def _reload(proto, weights, x):
    net = torchcaffe.load(proto, weights)
    with torch.no_grad():
        out = net(data=x)
    assert len(out) == 1, out.keys()
    return next(iter(out.values()))


@pytest.mark.parametrize("make, size", MODELS)
def test_whole_model_round_trip(tmp_path, make, size):
    torch.manual_seed(0)
    model = randomize_batch_norm(make())
    x = torch.randn(2, 3, size, size)
    proto, weights = _export(tmp_path, model, x)
    with torch.no_grad():
        want = model(x)
    got = _reload(proto, weights, x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert not list(tmp_path.glob(".*.tmp")), "atomic writes left temporaries"


@pytest.mark.parametrize("make, size", MODELS)
def test_whole_model_loads_in_opencv(tmp_path, make, size):
    cv2 = pytest.importorskip("cv2")
    if not hasattr(cv2, "dnn") or not hasattr(cv2.dnn, "readNetFromCaffe"):
        pytest.skip(f"OpenCV {cv2.__version__} has no Caffe importer (removed in 5.x)")
    torch.manual_seed(0)
    model = randomize_batch_norm(make())
    x = torch.randn(2, 3, size, size)
    proto, weights = _export(tmp_path, model, x)
    cv = cv2.dnn.readNetFromCaffe(str(proto), str(weights))
    cv.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    cv.setInput(x.numpy())
    out_name = torchcaffe.load(proto).output_names[0]
    got = cv.forward(out_name)
    with torch.no_grad():
        want = model(x).numpy()
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel < 1e-4, rel


# -- single ops: (module, input shape) -----------------------------------------------------
class Add(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.a(x)
        y += self.b(x)
        return y * self.b(x)


class Arith(nn.Module):
    def forward(self, x):
        y = torch.relu(x) * torch.sigmoid(x)
        return torch.cat([y + 1.0, y - x, x / 4.0, 2 * x, 3 - x, -y], dim=1)


class Views(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 6 * 5, 7)

    def forward(self, x):
        y = self.fc(x.view(x.size(0), -1))
        return F.softmax(y.reshape(x.size(0), 7, 1), dim=1)


class Functional(nn.Module):
    def forward(self, x):
        x = F.max_pool2d(x, 2, ceil_mode=True)
        x = F.avg_pool2d(x, 2, 1)
        x = F.leaky_relu(x, 0.2)
        return F.adaptive_avg_pool2d(x, 1).flatten(1)


class SqueezeExcite(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(4, 2, 1), nn.Conv2d(2, 4, 1)

    def forward(self, x):
        s = torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))))
        return x * s + s


class Elementwise(nn.Module):
    """The element-wise functions with no torch module: AbsVal, Exp, Log, Power, Eltwise MAX."""

    def forward(self, x):
        a, b, c = x.abs(), torch.exp(x * 0.5), torch.log(torch.abs(x) + 1.0)
        d, e, f = x**2, x.pow(3), torch.maximum(x, x * -0.5)
        return torch.cat([a, b, c, d, e, f, x.exp().log(), torch.max(x, b)], dim=1)


class Clamps(nn.Module):
    """clamp and clip as Clip, ReLU6 and ReLU."""

    def forward(self, x):
        return torch.cat([torch.clamp(x, -1.0, 0.5), x.clamp(0, 6), x.clip(min=0)], dim=1)


class Slices(nn.Module):
    """``x[:, a:b]`` on one axis as Slice (the parts not kept to Silence layers)."""

    def forward(self, x):
        return torch.cat([x[:, 1:3] + x[:, :2] * x[:, 2:], x[:, :2][:, :, 2:, :]], dim=2)


class Shuffle(nn.Module):
    """ShuffleNet's channel shuffle and an NHWC head: Reshape, Permute (fork), Reshape."""

    def forward(self, x):
        n, c, h, w = x.shape
        y = x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)
        return y.permute(0, 2, 3, 1).flatten(1) + torch.permute(y, (0, 2, 3, 1)).flatten(1)


class Pads(nn.Module):
    def forward(self, x):
        return F.pad(x, (1, 1, 2, 0), value=0.5) + F.pad(x, (1, 1, 2, 0), mode="reflect")


class Reductions(nn.Module):
    """sum and mean over trailing axes as Reduction (a keepdim one reshaped back)."""

    def forward(self, x):
        a, b = x.sum(dim=(1, 2, 3)), torch.mean(x, dim=-1, keepdim=True).flatten(1)
        c, d = x.sum(-1).flatten(1), x.mean(dim=(2, 3, 1), keepdim=True).flatten(1)
        return torch.cat([a.reshape(-1, 1), b, c, d], dim=1)


class SumAll(nn.Module):
    def forward(self, x):
        return x.sum()


class MeanHead(nn.Module):
    def forward(self, x):
        return torch.mean(x, dim=(-2, -1))


OPS = [
    (SqueezeExcite(), (2, 4, 5, 6)),
    (MeanHead(), (2, 4, 5, 6)),
    (nn.Conv2d(3, 6, 3, stride=2, padding=1, groups=3, dilation=2), (2, 3, 11, 9)),
    (nn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 0), bias=False), (2, 3, 9, 8)),
    (nn.Conv2d(3, 4, 3, padding="same"), (1, 3, 7, 6)),
    (nn.ConvTranspose2d(4, 6, 4, stride=2, padding=1, groups=2), (2, 4, 5, 6)),
    (nn.ConvTranspose2d(3, 2, 3, bias=False, dilation=2), (2, 3, 5, 4)),
    (nn.Sequential(nn.Flatten(), nn.Linear(60, 5)), (2, 3, 4, 5)),
    (nn.Linear(5, 3), (2, 4, 5)),
    (nn.Linear(5, 3, bias=False), (2, 5)),
    (nn.BatchNorm2d(3), (2, 3, 4, 5)),
    (nn.BatchNorm2d(3, affine=False), (2, 3, 4, 5)),
    (nn.BatchNorm1d(5), (4, 5)),
    (nn.ReLU(), (2, 3, 4, 5)),
    (nn.LeakyReLU(0.1), (2, 3, 4, 5)),
    (nn.PReLU(3), (2, 3, 4, 5)),
    (nn.PReLU(), (2, 3, 4, 5)),
    (nn.Sigmoid(), (2, 3, 4, 5)),
    (nn.Tanh(), (2, 3, 4, 5)),
    (nn.ELU(0.7), (2, 3, 4, 5)),
    (nn.ReLU6(), (2, 3, 4, 5)),
    (nn.Hardtanh(-2.0, 3.0), (2, 3, 4, 5)),
    (nn.Hardswish(), (2, 3, 4, 5)),
    (nn.Hardsigmoid(), (2, 3, 4, 5)),
    (nn.SiLU(), (2, 3, 4, 5)),
    (nn.Softplus(), (2, 3, 4, 5)),
    (Elementwise(), (2, 3, 4, 5)),
    (Clamps(), (2, 3, 4, 5)),
    (Slices(), (2, 4, 5, 6)),
    (Reductions(), (2, 3, 4, 5)),
    (SumAll(), (2, 3, 4)),
    (nn.ZeroPad2d((1, 2, 0, 3)), (2, 3, 4, 5)),
    (nn.ReplicationPad2d((2, 1, 1, 0)), (2, 3, 4, 5)),
    (Pads(), (2, 3, 4, 5)),
    (nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), (2, 3, 5, 6)),
    (nn.Conv2d(3, 4, (3, 5), padding=(1, 2), padding_mode="replicate"), (2, 3, 5, 6)),
    (Shuffle(), (2, 4, 3, 5)),
    (nn.MaxPool2d(3, 2, 1), (2, 3, 14, 13)),
    (nn.MaxPool2d(2), (2, 3, 7, 9)),
    (nn.MaxPool2d(3, 2, ceil_mode=True), (2, 3, 8, 9)),
    (nn.AvgPool2d(3, 2, 1), (2, 3, 14, 13)),
    (nn.AvgPool2d(3, 2, 1, ceil_mode=True), (2, 3, 6, 7)),  # last window clipped at H + pad
    (nn.MaxPool2d(3, 2, 1, ceil_mode=True), (2, 3, 6, 7)),
    (nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False), (2, 3, 7, 9)),
    (nn.AdaptiveAvgPool2d(1), (2, 3, 5, 7)),
    (nn.AdaptiveAvgPool2d((2, 3)), (2, 3, 4, 9)),
    (nn.AdaptiveMaxPool2d(1), (2, 3, 5, 7)),
    (nn.Sequential(nn.Dropout(0.3), nn.Softmax(dim=1)), (2, 3, 4, 5)),
    (nn.Softmax(dim=-1), (2, 3, 4)),
    (nn.Flatten(1, 2), (2, 3, 4, 5)),
    (nn.Upsample(scale_factor=2, mode="nearest"), (2, 3, 4, 5)),
    (nn.Upsample(scale_factor=(3, 1), mode="nearest"), (2, 3, 4, 5)),
    (nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True), (2, 3, 4, 5)),
    (nn.Upsample(size=(7, 9), mode="bilinear", align_corners=False), (2, 3, 4, 5)),
    (nn.PixelShuffle(2), (2, 8, 3, 4)),
    (Add(), (2, 3, 5, 6)),
    (Arith(), (2, 3, 5, 6)),
    (Views(), (2, 3, 6, 5)),
    (Functional(), (2, 3, 9, 11)),
]


@pytest.mark.parametrize(
    "module, shape", OPS, ids=[f"{i}-{type(m).__name__}" for i, (m, _) in enumerate(OPS)]
)
def test_op_round_trip(tmp_path, module, shape):
    torch.manual_seed(1)
    if isinstance(module, (nn.BatchNorm2d, nn.BatchNorm1d)):
        with torch.no_grad():
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    module.eval()
    x = torch.randn(shape)
    proto, weights = _export(tmp_path, module, x)
    with torch.no_grad():
        want = module(x)
    torch.testing.assert_close(_reload(proto, weights, x), want, rtol=1e-5, atol=1e-5)


def test_batch_norm_becomes_batchnorm_plus_scale(tmp_path):
    proto, _ = _export(tmp_path, nn.BatchNorm2d(3).eval(), torch.randn(1, 3, 2, 2))
    layers = read_net(proto).layer
    assert [lp.type for lp in layers] == ["Input", "BatchNorm", "Scale"]
    assert layers[1].batch_norm_param.use_global_stats
    assert layers[2].scale_param.bias_term


def test_scale_after_batch_norm_is_in_place(tmp_path):
    """As Caffe models pair them: caffe2onnx fuses BatchNorm + Scale and reads the pair's
    output under the BatchNorm's top, so a Scale writing a top of its own breaks the graph."""
    model = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3), nn.ReLU()).eval()
    proto, _ = _export(tmp_path, model, torch.randn(1, 2, 4, 4))
    bn, scale, relu = read_net(proto).layer[2:]
    assert list(scale.bottom) == list(scale.top) == list(bn.top)
    assert list(relu.bottom) == list(bn.top)
    proto, weights = _export(tmp_path, model[:2], torch.randn(1, 2, 4, 4))
    assert [lp.type for lp in read_net(proto).layer][-1] == "Scale"  # an output: no Split copy


def test_floor_rounded_pooling_is_sliced_to_torch_size(tmp_path):
    proto, _ = _export(tmp_path, nn.MaxPool2d(3, 2, 1), torch.randn(1, 1, 14, 14))
    types = [lp.type for lp in read_net(proto).layer]
    assert types.count("Slice") == 2 and types.count("Silence") == 2


@pytest.mark.parametrize(
    "module, shape, fork",
    [
        (nn.Hardswish(), (1, 2, 3, 3), "HardSwish"),
        (nn.Hardsigmoid(), (1, 2, 3, 3), "HardSigmoid"),
        (nn.PixelShuffle(2), (1, 4, 3, 3), "PixelShuffle"),
        (nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True), (1, 2, 3, 3), "Interp"),
        (Shuffle(), (1, 4, 3, 3), "Permute"),
        (nn.ReflectionPad2d(1), (1, 2, 3, 3), "Pad"),
        (nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"), (1, 2, 3, 3), "Pad"),
    ],
)
def test_strict_bvlc_refuses_fork_layers(tmp_path, module, shape, fork):
    with pytest.raises(ExportError, match=f"fork layer '{fork}'.*strict_bvlc"):
        _export(tmp_path, module, torch.randn(shape), strict_bvlc=True)
    assert not list(tmp_path.iterdir()), "nothing is written on error"


def test_strict_bvlc_uses_clip_and_deconvolution(tmp_path):
    model = nn.Sequential(nn.ReLU6(), nn.Upsample(scale_factor=3, mode="nearest")).eval()
    x = torch.randn(2, 3, 4, 5) * 5
    proto, weights = _export(tmp_path, model, x, strict_bvlc=True)
    assert [lp.type for lp in read_net(proto).layer] == ["Input", "Clip", "Deconvolution"]
    torch.testing.assert_close(_reload(proto, weights, x), model(x), rtol=0, atol=1e-6)


class Unsupported(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, 1)


class Broadcast(nn.Module):
    def forward(self, x):
        return x * x.amax((2, 3), keepdim=True)


def test_unsupported_op_names_op_and_node(tmp_path):
    with pytest.raises(ExportError, match=r"unsupported op function .*cumsum at node 'cumsum'"):
        _export(tmp_path, Unsupported(), torch.randn(1, 2, 3))
    with pytest.raises(ExportError, match=r"unsupported op method Tensor.amax at node 'amax'"):
        _export(tmp_path, Broadcast(), torch.randn(1, 2, 3, 3))


def test_unsupported_module_and_geometry(tmp_path):
    with pytest.raises(ExportError, match=r"module torch.nn.*LSTM at node 'lstm'"):
        _export(tmp_path, _LSTM(), torch.randn(2, 3))
    with pytest.raises(ExportError, match="output_padding"):
        _export(tmp_path, nn.ConvTranspose2d(2, 2, 3, 2, output_padding=1), torch.randn(1, 2, 4, 4))
    with pytest.raises(ExportError, match="count_include_pad=False"):
        _export(tmp_path, nn.AvgPool2d(3, 1, 1, count_include_pad=False), torch.randn(1, 2, 4, 4))
    with pytest.raises(ExportError, match="padding_mode='circular'"):
        _export(
            tmp_path,
            nn.Conv2d(2, 2, 3, padding=1, padding_mode="circular"),
            torch.randn(1, 2, 4, 4),
        )
    with pytest.raises(ExportError, match=r"Softplus\(beta=2"):
        _export(tmp_path, nn.Softplus(beta=2), torch.randn(1, 2, 4, 4))


class ClampAbove(nn.Module):
    def forward(self, x):
        return x.clamp(min=0.1)


class Strided(nn.Module):
    def forward(self, x):
        return x[:, ::2]


class Picked(nn.Module):
    def forward(self, x):
        return x[:, 1]


def test_indexing_other_than_one_range_is_refused(tmp_path):
    with pytest.raises(ExportError, match=r"indexing .* with a step at node 'getitem'"):
        _export(tmp_path, Strided(), torch.randn(1, 4, 3, 3))
    with pytest.raises(ExportError, match=r"indexing .*one axis sliced by a:b only"):
        _export(tmp_path, Picked(), torch.randn(1, 4, 3, 3))


def test_a_one_sided_clamp_other_than_relu_is_refused(tmp_path):
    """Caffe's Clip needs both bounds; FLT_MAX for the open one would make an infinity
    finite, so only min=0 (a ReLU) is written."""
    with pytest.raises(ExportError, match=r"clamp\(min=0.1, max=None\) at node 'clamp'"):
        _export(tmp_path, ClampAbove(), torch.randn(1, 2, 4, 4))


class _LSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 3)

    def forward(self, x):
        return self.lstm(x)[0]


def test_torchnet_exports_back_without_loss(tmp_path, models_root):
    src = models_root / "lenet_mnist"
    net = torchcaffe.load(src / "lenet.prototxt", src / "lenet_iter_10000.caffemodel")
    proto, weights = _export(tmp_path, net, None)
    again = torchcaffe.load(proto, weights)
    assert read_net(proto) == net.net_param
    for a, b in zip(net.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)


# OpenCV 4.x's importer (its padding layer is "Padding", not the fork's "Pad")
OPENCV_LACKS = {"Clip", "PixelShuffle", "BilinearInterpolate", "Bias", "Pad", "Reduction"}


class KeptSum(nn.Module):
    def forward(self, x):
        return x.sum(dim=-1, keepdim=True) + x.mean(dim=(2, 3), keepdim=True)


class FoldsTheBatch(nn.Module):
    def forward(self, x):
        return torch.cat([x.view(-1) * 2, x.reshape(-1, 6).sum(-1)])


@pytest.mark.parametrize(
    "module", [KeptSum(), Reductions(), SqueezeExcite(), FoldsTheBatch()], ids=type
)
def test_a_keepdim_reduction_runs_at_another_batch(tmp_path, module):
    """The Reshape after a keepdim Reduction copies the kept axes (0), and one that folds
    the batch in infers it (-1), so the net exported at batch 2 runs at batch 3 (literal
    dims pinned the batch: a count mismatch)."""
    torch.manual_seed(2)
    module.eval()
    proto, weights = _export(tmp_path, module, torch.randn(2, 4, 5, 6))
    x = torch.randn(3, 4, 5, 6)
    with torch.no_grad():
        want = module(x)
    torch.testing.assert_close(_reload(proto, weights, x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "module, shape", OPS, ids=[f"{i}-{type(m).__name__}" for i, (m, _) in enumerate(OPS)]
)
def test_op_loads_in_opencv(tmp_path, module, shape):
    cv2 = pytest.importorskip("cv2")
    if not hasattr(cv2.dnn, "readNetFromCaffe"):
        pytest.skip(f"OpenCV {cv2.__version__} has no Caffe importer (removed in 5.x)")
    torch.manual_seed(1)
    module.eval()
    x = torch.randn(shape)
    proto, weights = _export(tmp_path, module, x)
    layers = read_net(proto).layer
    types = {lp.type for lp in layers}
    if types & OPENCV_LACKS:
        pytest.skip(f"OpenCV has no {sorted(types & OPENCV_LACKS)} layer")
    if any(lp.type == "Deconvolution" and lp.convolution_param.dilation for lp in layers):
        pytest.skip("OpenCV 4.x gives a dilated Deconvolution the wrong output size")
    cv = cv2.dnn.readNetFromCaffe(str(proto), str(weights))
    cv.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    cv.setInput(x.numpy())
    got = cv.forward(torchcaffe.load(proto).output_names[0])
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5)


class TwoInTwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, y):
        z = self.conv(x) + y
        return z, torch.sigmoid(z)


def test_several_inputs_and_outputs(tmp_path):
    model = TwoInTwoOut().eval()
    x, y = torch.randn(2, 3, 5, 6), torch.randn(2, 4, 5, 6)
    proto, weights = tmp_path / "n.prototxt", tmp_path / "n.caffemodel"
    torchcaffe.export(model, (x, y), proto, weights, input_names=["image", "bias"])
    net = torchcaffe.load(proto, weights)
    assert net.input_names == ["image", "bias"]
    assert sorted(net.output_names) == ["add/output", "sigmoid"]  # add is also read by sigmoid
    with torch.no_grad():
        out = net(image=x, bias=y)
        z, s = model(x, y)
    torch.testing.assert_close(out["sigmoid"], s)
    torch.testing.assert_close(out["add/output"], z)


class DataDependent(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x


def test_untraceable_module_is_an_export_error(tmp_path):
    with pytest.raises(ExportError, match="torch.fx cannot trace DataDependent"):
        _export(tmp_path, DataDependent(), torch.randn(1, 2))


def test_a_wrong_mapping_is_caught_by_the_check(tmp_path, monkeypatch):
    """The exporter runs the compiled Caffe net on the example and refuses to write on a
    mismatch (here a deliberately wrong mapping: Sigmoid written as TanH)."""
    from torchcaffe.converters import torch_layers

    wrong = [(nn.Sigmoid, torch_layers._neuron("TanH"))]
    monkeypatch.setattr(torch_layers, "_MODULE_HANDLERS", wrong)
    with pytest.raises(ExportError, match="disagrees with the module on output blob 'sigmoid'"):
        _export(tmp_path, nn.Sigmoid(), torch.randn(2, 3))
    assert not list(tmp_path.iterdir())


def test_example_input_that_does_not_fit_is_an_export_error(tmp_path):
    with pytest.raises(ExportError, match=r"on the example input failed.*\(2, 7\)"):
        _export(tmp_path, nn.Linear(5, 3), torch.randn(2, 7))


class SharedConv(nn.Module):
    """One conv called twice: Caffe shares its params by ParamSpec name."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.relu(self.conv(x)))


def test_module_called_twice_shares_params(tmp_path):
    from torchcaffe.converters import caffemodel_to_state_dict

    torch.manual_seed(0)
    model = SharedConv().eval()
    x = torch.randn(2, 4, 5, 6)
    proto, weights = _export(tmp_path, model, x)
    layers = {lp.name: lp for lp in read_net(proto).layer}
    assert [p.name for p in layers["conv"].param] == ["conv/0", "conv/1"]
    assert [p.name for p in layers["conv_1"].param] == ["conv/0", "conv/1"]
    torch.testing.assert_close(_reload(proto, weights, x), model(x))
    caffemodel_to_state_dict(proto, weights, tmp_path / "r.pt", readable=True)
    fresh = SharedConv()
    fresh.load_state_dict(torch.load(tmp_path / "r.pt", weights_only=True), strict=True)
    assert torch.equal(fresh.conv.weight, model.conv.weight)


class InPlaceWrites(nn.Module):
    """In-place ops whose input is read again afterwards: the later reads see the result."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.conv(x)
        self.relu(y)  # result unused: y itself is rectified
        z = self.conv2(y)
        z.add_(y)
        F.leaky_relu(z, 0.2, inplace=True)
        return torch.cat((z, y), dim=1)


def test_in_place_writes_reach_later_readers(tmp_path):
    """fx gives an in-place op its own node, but later code reads the mutated input's node:
    the exported net read the values from before the write (the check refused to write it)."""
    torch.manual_seed(0)
    module = InPlaceWrites().eval()
    x = torch.randn(2, 3, 6, 6)
    proto, weights = _export(tmp_path, module, x)
    with torch.no_grad():
        want = module(x.clone())
    torch.testing.assert_close(_reload(proto, weights, x), want, rtol=1e-5, atol=1e-5)
