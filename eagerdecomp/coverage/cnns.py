"""Classic CNNs, written here, for the model corpus (torchvision's wheels here do not load).

Each is the architecture's characteristic blocks at toy width for 32x32 RGB input, with a
10-way head; ``forward(x, labels)`` returns the cross-entropy loss, ``forward(x)`` the logits.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["CNNS"]


class _Classifier(nn.Module):
    def __init__(self, features: nn.Module, width: int, classes: int = 10):
        super().__init__()
        self.features, self.head = features, nn.Linear(width, classes)

    def forward(self, x, labels=None):
        logits = self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))
        return logits if labels is None else F.cross_entropy(logits, labels)


def _conv_bn(cin, cout, k=3, stride=1, groups=1, act=nn.ReLU):
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), act()
    )


class _Residual(nn.Module):
    """ResNet's basic block: two 3x3 convolutions and a (projected) shortcut."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(
            _conv_bn(cin, cout, stride=stride), nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        )
        self.skip = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x):
        return F.relu(self.body(x) + self.skip(x))


class _Inverted(nn.Module):
    """MobileNetV2 / EfficientNet: expand, depthwise, (squeeze-excite), project, residual."""

    def __init__(self, cin, cout, stride, act=nn.ReLU6, se=False):
        super().__init__()
        mid = cin * 4
        layers = [_conv_bn(cin, mid, 1, act=act), _conv_bn(mid, mid, 3, stride, groups=mid, act=act)]
        if se:
            layers.append(_SqueezeExcite(mid))
        layers += [nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body, self.residual = nn.Sequential(*layers), stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class _SqueezeExcite(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(F.adaptive_avg_pool2d(x, 1)))))


class _Fire(nn.Module):
    """SqueezeNet: squeeze 1x1, then 1x1 and 3x3 expansions concatenated."""

    def __init__(self, cin, squeeze, expand):
        super().__init__()
        self.s, self.e1, self.e3 = (
            nn.Conv2d(cin, squeeze, 1),
            nn.Conv2d(squeeze, expand, 1),
            nn.Conv2d(squeeze, expand, 3, padding=1),
        )

    def forward(self, x):
        s = F.relu(self.s(x))
        return torch.cat([F.relu(self.e1(s)), F.relu(self.e3(s))], 1)


class _Dense(nn.Module):
    """DenseNet: each layer's output concatenated to its input."""

    def __init__(self, cin, growth, layers):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(
                nn.BatchNorm2d(cin + i * growth), nn.ReLU(), nn.Conv2d(cin + i * growth, growth, 3, 1, 1, bias=False)
            )
            for i in range(layers)
        )

    def forward(self, x):
        for layer in self.layers:
            x = torch.cat([x, layer(x)], 1)
        return x


class _Inception(nn.Module):
    """GoogLeNet: 1x1, 3x3, 5x5 and pooled branches concatenated."""

    def __init__(self, cin, c):
        super().__init__()
        self.b1, self.b3, self.b5 = _conv_bn(cin, c, 1), _conv_bn(cin, c, 3), _conv_bn(cin, c, 5)
        self.bp = _conv_bn(cin, c, 1)

    def forward(self, x):
        return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(F.max_pool2d(x, 3, 1, 1))], 1)


class _Shuffle(nn.Module):
    """ShuffleNet: grouped 1x1 convolution, channel shuffle, depthwise 3x3."""

    def __init__(self, c, groups=2):
        super().__init__()
        self.g = groups
        self.a, self.dw, self.b = (
            _conv_bn(c, c, 1, groups=groups),
            _conv_bn(c, c, 3, groups=c, act=nn.Identity),
            _conv_bn(c, c, 1, groups=groups),
        )

    def forward(self, x):
        n, c, h, w = x.shape
        y = self.a(x).view(n, self.g, c // self.g, h, w).transpose(1, 2).reshape(n, c, h, w)
        return F.relu(x + self.b(self.dw(y)))


class _UNet(nn.Module):
    """U-Net: down, up with a transposed convolution, skip concatenation, per-pixel classes."""

    def __init__(self):
        super().__init__()
        self.down1, self.down2 = _conv_bn(3, 16), _conv_bn(16, 32)
        self.up, self.fuse, self.out = nn.ConvTranspose2d(32, 16, 2, 2), _conv_bn(32, 16), nn.Conv2d(16, 10, 1)

    def forward(self, x, labels=None):
        a = self.down1(x)
        b = self.down2(F.max_pool2d(a, 2))
        y = self.out(self.fuse(torch.cat([a, self.up(b)], 1)))
        y = F.interpolate(y, scale_factor=0.5, mode="bilinear", align_corners=False)
        return y if labels is None else F.cross_entropy(y, labels[:, None, None].expand(-1, *y.shape[2:]))


def _lenet():
    f = nn.Sequential(nn.Conv2d(3, 6, 5), nn.Tanh(), nn.AvgPool2d(2), nn.Conv2d(6, 16, 5), nn.Tanh(), nn.AvgPool2d(2))
    return _Classifier(f, 16)


def _alexnet():
    f = nn.Sequential(
        nn.Conv2d(3, 16, 5, 2, 2),
        nn.ReLU(inplace=True),
        nn.LocalResponseNorm(3),
        nn.MaxPool2d(3, 2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
    )
    return _Classifier(f, 32)


def _vgg():
    f = nn.Sequential(_conv_bn(3, 16), nn.MaxPool2d(2), _conv_bn(16, 32), _conv_bn(32, 32), nn.MaxPool2d(2))
    return _Classifier(f, 32)


CNNS = {
    "LeNet5": _lenet,
    "AlexNet": _alexnet,
    "VGG": _vgg,
    "ResNet": lambda: _Classifier(nn.Sequential(_conv_bn(3, 16), _Residual(16, 16, 1), _Residual(16, 32, 2)), 32),
    "MobileNetV2": lambda: _Classifier(
        nn.Sequential(_conv_bn(3, 16, act=nn.ReLU6), _Inverted(16, 16, 1), _Inverted(16, 24, 2)), 24
    ),
    "EfficientNet": lambda: _Classifier(
        nn.Sequential(
            _conv_bn(3, 16, act=nn.SiLU), _Inverted(16, 16, 1, nn.SiLU, se=True), _Inverted(16, 24, 2, nn.SiLU, se=True)
        ),
        24,
    ),
    "SqueezeNet": lambda: _Classifier(
        nn.Sequential(nn.Conv2d(3, 16, 3, 2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True), _Fire(16, 8, 16)), 32
    ),
    "DenseNet": lambda: _Classifier(nn.Sequential(_conv_bn(3, 16), _Dense(16, 8, 3)), 40),
    "GoogLeNet": lambda: _Classifier(nn.Sequential(_conv_bn(3, 16), _Inception(16, 8)), 32),
    "ShuffleNet": lambda: _Classifier(nn.Sequential(_conv_bn(3, 16), _Shuffle(16)), 16),
    "UNet": _UNet,
}
