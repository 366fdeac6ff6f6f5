"""The benchmark baselines: CaffeNet, GoogLeNet, ResNet-50 and MobileNetV2 written by hand in
idiomatic torch (nn.Conv2d / nn.BatchNorm2d / nn.ReLU(inplace=True) / nn.MaxPool2d ...), the
way a PyTorch user would write them, with weights copied from a compiled net.

``copy_weights`` walks the compiled net's layers in Caffe order (Convolution / InnerProduct,
and BatchNorm followed by its Scale) and the hand-written module's Conv2d / Linear /
BatchNorm2d in registration order, which each model below keeps equal to Caffe's. Each
model ends in a softmax, as the deploy nets do.
"""

from __future__ import annotations

import torch
from torch import nn

import torchcaffe


def copy_weights(model: nn.Module, net: torchcaffe.TorchNet) -> nn.Module:
    """Copy ``net``'s params into ``model`` by order (shapes checked); returns ``model``."""
    sources: list[tuple[str, list[torch.Tensor]]] = []
    steps = net.steps
    for i, step in enumerate(steps):
        blobs = [b.detach() for b in net.layers[step.key].param_blobs()]
        if step.type in ("Convolution", "InnerProduct"):
            sources.append(("linear", blobs))
        elif step.type == "BatchNorm":
            scale = net.layers[steps[i + 1].key]
            assert steps[i + 1].type == "Scale", step.name
            factor = blobs[2][0]
            factor = 1 / factor if factor != 0 else factor
            w, b = (t.detach() for t in scale.param_blobs())
            eps = net.layers[step.key].param.eps
            sources.append(("bn", [blobs[0] * factor, blobs[1] * factor, w, b, eps]))
    targets = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear, nn.BatchNorm2d))]
    assert len(targets) == len(sources), (len(targets), len(sources))
    with torch.no_grad():
        for module, (kind, blobs) in zip(targets, sources):
            if kind == "bn":
                assert isinstance(module, nn.BatchNorm2d)
                module.running_mean.copy_(blobs[0])
                module.running_var.copy_(blobs[1])
                module.weight.copy_(blobs[2])
                module.bias.copy_(blobs[3])
                module.eps = float(blobs[4])
                continue
            module.weight.copy_(blobs[0].reshape(module.weight.shape))
            if len(blobs) > 1:
                module.bias.copy_(blobs[1])
    return model


def _conv_relu(cin: int, cout: int, k: int, s: int = 1, p: int = 0, g: int = 1) -> list:
    return [nn.Conv2d(cin, cout, k, s, p, groups=g), nn.ReLU(inplace=True)]


class CaffeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        lrn = dict(size=5, alpha=1e-4, beta=0.75, k=1.0)
        self.features = nn.Sequential(
            *_conv_relu(3, 96, 11, 4),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            nn.LocalResponseNorm(**lrn),
            *_conv_relu(96, 256, 5, 1, 2, 2),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            nn.LocalResponseNorm(**lrn),
            *_conv_relu(256, 384, 3, 1, 1),
            *_conv_relu(384, 384, 3, 1, 1, 2),
            *_conv_relu(384, 256, 3, 1, 1, 2),
            nn.MaxPool2d(3, 2, ceil_mode=True),
        )
        self.classifier = nn.Sequential(
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(),
            nn.Linear(4096, 1000),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1)).softmax(1)


class Inception(nn.Module):
    def __init__(self, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, cp: int) -> None:
        super().__init__()
        self.b1 = nn.Sequential(*_conv_relu(cin, c1, 1))
        self.b3 = nn.Sequential(*_conv_relu(cin, c3r, 1), *_conv_relu(c3r, c3, 3, 1, 1))
        self.b5 = nn.Sequential(*_conv_relu(cin, c5r, 1), *_conv_relu(c5r, c5, 5, 1, 2))
        self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), *_conv_relu(cin, cp, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(x)], 1)


class GoogLeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        lrn = dict(size=5, alpha=1e-4, beta=0.75, k=1.0)
        pool = dict(kernel_size=3, stride=2, ceil_mode=True)
        self.stem = nn.Sequential(
            *_conv_relu(3, 64, 7, 2, 3),
            nn.MaxPool2d(**pool),
            nn.LocalResponseNorm(**lrn),
            *_conv_relu(64, 64, 1),
            *_conv_relu(64, 192, 3, 1, 1),
            nn.LocalResponseNorm(**lrn),
            nn.MaxPool2d(**pool),
        )
        self.blocks = nn.Sequential(
            Inception(192, 64, 96, 128, 16, 32, 32),
            Inception(256, 128, 128, 192, 32, 96, 64),
            nn.MaxPool2d(**pool),
            Inception(480, 192, 96, 208, 16, 48, 64),
            Inception(512, 160, 112, 224, 24, 64, 64),
            Inception(512, 128, 128, 256, 24, 64, 64),
            Inception(512, 112, 144, 288, 32, 64, 64),
            Inception(528, 256, 160, 320, 32, 128, 128),
            nn.MaxPool2d(**pool),
            Inception(832, 256, 160, 320, 32, 128, 128),
            Inception(832, 384, 192, 384, 48, 128, 128),
            nn.AvgPool2d(7, 1),
            nn.Dropout(0.4),
        )
        self.classifier = nn.Linear(1024, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.blocks(self.stem(x)).flatten(1)).softmax(1)


def _conv_bn(cin: int, cout: int, k: int, s: int = 1, p: int = 0, g: int = 1) -> list:
    return [nn.Conv2d(cin, cout, k, s, p, groups=g, bias=False), nn.BatchNorm2d(cout)]


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        out = 4 * width
        self.shortcut = (
            nn.Sequential(*_conv_bn(cin, out, 1, stride)) if stride != 1 or cin != out else None
        )
        self.body = nn.Sequential(
            *_conv_bn(cin, width, 1, stride),
            nn.ReLU(inplace=True),
            *_conv_bn(width, width, 3, 1, 1),
            nn.ReLU(inplace=True),
            *_conv_bn(width, out, 1),
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.shortcut is None else self.shortcut(x)
        return self.relu(self.body(x) + identity)


class ResNet(nn.Module):
    def __init__(self, blocks: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            *_conv_bn(3, 64, 7, 2, 3),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, ceil_mode=True),
        ]
        cin = 64
        for stage, n in enumerate(blocks):
            width = 64 * 2**stage
            for i in range(n):
                layers.append(Bottleneck(cin, width, 2 if i == 0 and stage > 0 else 1))
                cin = 4 * width
        layers.append(nn.AvgPool2d(7, 1))
        self.features = nn.Sequential(*layers)
        # the Caffe files keep bias on conv1 only: it has no bias_term: false
        self.features[0] = nn.Conv2d(3, 64, 7, 2, 3)
        self.fc = nn.Linear(2048, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).flatten(1)).softmax(1)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, expand: int, stride: int) -> None:
        super().__init__()
        mid = cin * expand
        self.body = nn.Sequential(
            *_conv_bn(cin, mid, 1),
            nn.ReLU(inplace=True),
            *_conv_bn(mid, mid, 3, stride, 1, mid),
            nn.ReLU(inplace=True),
            *_conv_bn(mid, cout, 1),
        )
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    # (expand, channels, blocks, first stride). The shared Caffe model (mobilenet_v2_deploy)
    # downsamples at the first 96-channel block, not at the first 64-channel block as the
    # paper's table (and torchvision) do: its 64-channel blocks run at 28 x 28.
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 1), (6, 96, 3, 2))
    SETTINGS += ((6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, 32, 3, 2, 1), nn.ReLU(inplace=True)]
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, t, s if i == 0 else 1))
                cin = c
        layers += [*_conv_bn(cin, 1280, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Conv2d(1280, 1000, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x)).flatten(1).softmax(1)


# name -> (prototxt under ../shared/models, model class, output blob, input size)
NETS = {
    "CaffeNet": ("bvlc_reference_caffenet/deploy.prototxt", CaffeNet, "prob", 227),
    "GoogLeNet": ("bvlc_googlenet/deploy.prototxt", GoogLeNet, "prob", 224),
    "ResNet-50": ("resnet50_kaiminghe/ResNet-50-deploy.prototxt", ResNet, "prob", 224),
    "MobileNetV2": ("mobilenet_v2/mobilenet_v2_deploy.prototxt", MobileNetV2, "prob", 224),
}
