"""torchvision-style ResNet-18, MobileNetV2 and VGG-11, written here (torchvision is not a
dependency). Same graphs as torchvision's; ``width`` divides the channel counts to keep tests
fast without changing the structure."""

from __future__ import annotations

import torch
from torch import nn


def randomize_batch_norm(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial running stats and affine params, so BN export is really exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
    return model.eval()


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000, width: int = 1) -> None:
        super().__init__()
        c = [64 // width, 128 // width, 256 // width, 512 // width]
        self.inplanes = c[0]
        self.conv1 = nn.Conv2d(3, c[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(c[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(c[0], 2)
        self.layer2 = self._make_layer(c[1], 2, stride=2)
        self.layer3 = self._make_layer(c[2], 2, stride=2)
        self.layer4 = self._make_layer(c[3], 2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(c[3], num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1):
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU(inp, hidden, kernel=1))
        layers += [
            ConvBNReLU(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    SETTINGS = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]

    def __init__(self, num_classes: int = 1000, width: int = 1) -> None:
        super().__init__()
        cin, last = 32 // width, 1280 // width
        features: list[nn.Module] = [ConvBNReLU(3, cin, stride=2)]
        for t, c, n, s in self.SETTINGS:
            cout = max(8, c // width)
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(ConvBNReLU(cin, last, kernel=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        return self.classifier(x)


class VGG11(nn.Module):
    CFG = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]

    def __init__(self, num_classes: int = 1000, width: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for v in self.CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(cin, int(v) // width, 3, padding=1), nn.ReLU(inplace=True)]
                cin = int(v) // width
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        hidden = 4096 // width
        self.classifier = nn.Sequential(
            nn.Linear(cin * 7 * 7, hidden),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(hidden, hidden),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        x = torch.flatten(x, 1)
        return self.classifier(x)


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    n, c, h, w = x.size()
    x = x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous()
    return x.view(n, c, h, w)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2's unit. torchvision splits with ``x.chunk(2, dim=1)``, whose unpacking
    torch.fx cannot trace; the halves are taken by slicing here, the same graph."""

    def __init__(self, inp: int, oup: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        half = oup // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False),
                nn.BatchNorm2d(inp),
                nn.Conv2d(inp, half, 1, bias=False),
                nn.BatchNorm2d(half),
                nn.ReLU(inplace=True),
            )
        cin = inp if stride > 1 else half
        self.branch2 = nn.Sequential(
            nn.Conv2d(cin, half, 1, bias=False),
            nn.BatchNorm2d(half),
            nn.ReLU(inplace=True),
            nn.Conv2d(half, half, 3, stride, 1, groups=half, bias=False),
            nn.BatchNorm2d(half),
            nn.Conv2d(half, half, 1, bias=False),
            nn.BatchNorm2d(half),
            nn.ReLU(inplace=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            half = x.shape[1] // 2
            out = torch.cat((x[:, :half], self.branch2(x[:, half:])), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, width: int = 1) -> None:
        super().__init__()
        stages = [116 // width, 232 // width, 464 // width]
        cin = 24
        self.conv1 = nn.Sequential(
            nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin), nn.ReLU(inplace=True)
        )
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        units: list[nn.Module] = []
        for repeats, cout in zip((4, 8, 4), stages):
            cout -= cout % 2
            units.append(ShuffleUnit(cin, cout, 2))
            units += [ShuffleUnit(cout, cout, 1) for _ in range(repeats - 1)]
            cin = cout
        self.stages = nn.Sequential(*units)
        last = 1024 // width
        self.conv5 = nn.Sequential(
            nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU(inplace=True)
        )
        self.fc = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv5(self.stages(self.maxpool(self.conv1(x))))
        return self.fc(x.mean([2, 3]))


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.fc2(nn.functional.silu(self.fc1(s))))


class MBConv(nn.Module):
    """EfficientNet's block: expand, depthwise, squeeze-excite, project; SiLU throughout."""

    def __init__(self, inp: int, oup: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = inp * expand
        self.use_res = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(inp, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.SiLU()]
        layers += [
            nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.SiLU(),
            SqueezeExcitation(hidden, max(1, inp // 4)),
            nn.Conv2d(hidden, oup, 1, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out + x if self.use_res else out


class EfficientNetB0(nn.Module):
    SETTINGS = [  # expand, kernel, stride, channels, repeats
        (1, 3, 1, 16, 1),
        (6, 3, 2, 24, 2),
        (6, 5, 2, 40, 2),
        (6, 3, 2, 80, 3),
        (6, 5, 1, 112, 3),
        (6, 5, 2, 192, 4),
        (6, 3, 1, 320, 1),
    ]

    def __init__(self, num_classes: int = 1000, width: int = 1) -> None:
        super().__init__()
        cin = 32 // width
        layers: list[nn.Module] = [
            nn.Conv2d(3, cin, 3, 2, 1, bias=False),
            nn.BatchNorm2d(cin),
            nn.SiLU(),
        ]
        for expand, kernel, stride, c, repeats in self.SETTINGS:
            cout = max(8, c // width)
            for i in range(repeats):
                layers.append(MBConv(cin, cout, kernel, stride if i == 0 else 1, expand))
                cin = cout
        last = 1280 // width
        layers += [nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))
