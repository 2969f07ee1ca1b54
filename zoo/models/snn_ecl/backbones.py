"""Convertible backbones: every activation is its own module (a spiking neuron holds state) and pooling is average.

``mlp`` and ``cnn_small`` are the ECL card's digits models; ``vgg16`` and ``resnet18`` are the CIFAR variants of the
paper's setting (3×3 stem, no stem pooling; in the ResNet the activation follows the residual addition, so every
block's output is a neuron).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from torch import Tensor, nn

__all__ = ["BACKBONES", "BasicBlock", "build_backbone"]

BACKBONES = ("mlp", "cnn_small", "vgg16", "resnet18")
_VGG16 = (64, 64, "P", 128, 128, "P", 256, 256, 256, "P", 512, 512, 512, "P", 512, 512, 512, "P")

Act = Callable[[], nn.Module]


class BasicBlock(nn.Module):
    """CIFAR ResNet basic block: conv-BN-act-conv-BN, plus the (1×1 conv-BN when the shape changes) shortcut, then
    act after the addition. Two activation modules, one per call site."""

    def __init__(self, cin: int, cout: int, stride: int, act: Act) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.act1 = act()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        self.act2 = act()

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(self.act1(self.bn1(self.conv1(x)))))
        return self.act2(out + self.shortcut(x))


def build_backbone(name: str, in_shape: list[int], num_classes: int, act: Act) -> nn.Module:
    """Build backbone ``name`` for images of shape ``in_shape`` ``[C, H, W]`` with activation factory ``act``.

    Example:
        >>> net = build_backbone("cnn_small", [1, 8, 8], 10, nn.ReLU)
        >>> sum(isinstance(m, nn.ReLU) for m in net.modules())
        4
    """
    c, h, w = in_shape
    if name == "mlp":  # 64-128-128-128-128-10: four spiking layers
        widths = [c * h * w, 128, 128, 128, 128]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(a, b), act()]
        return nn.Sequential(*layers, nn.Linear(widths[-1], num_classes))
    if name == "cnn_small":
        return nn.Sequential(
            nn.Conv2d(c, 16, 3, padding=1), nn.BatchNorm2d(16), act(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), act(),
            nn.AvgPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), act(),
            nn.AvgPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * (h // 4) * (w // 4), 128), act(),
            nn.Linear(128, num_classes),
        )  # fmt: skip
    if name == "vgg16":
        layers, channels, size = [], c, h
        for v in _VGG16:
            if v == "P":
                layers.append(nn.AvgPool2d(2))
                size //= 2
            else:
                layers += [nn.Conv2d(channels, v, 3, padding=1), nn.BatchNorm2d(v), act()]
                channels = v
        if size < 1:
            raise ValueError(f"vgg16 needs images of at least 32×32, got {h}×{w}")
        flat = channels * size * (w // 2**5)
        return nn.Sequential(
            *layers,
            nn.Flatten(),
            nn.Linear(flat, 4096), act(), nn.Dropout(0.5),
            nn.Linear(4096, 4096), act(), nn.Dropout(0.5),
            nn.Linear(4096, num_classes),
        )  # fmt: skip
    if name == "resnet18":
        layers = [nn.Conv2d(c, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), act()]
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride, act), BasicBlock(cout, cout, 1, act)]
            cin = cout
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes))
    close = difflib.get_close_matches(name, BACKBONES, n=1) or [b for b in BACKBONES if b.startswith(name)][:1]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown backbone {name!r}{hint}; choose one of {BACKBONES}")
