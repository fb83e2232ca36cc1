"""ResNet-50 (He et al. 2016): bottleneck blocks [3, 4, 6, 3], 224x224 ImageNet input."""

from __future__ import annotations

from torch import Tensor, nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000, blocks: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        layers, in_ch = [], 64
        for i, n in enumerate(blocks):
            width = 64 * 2**i
            stage = [Bottleneck(in_ch, width, stride=1 if i == 0 else 2)]
            in_ch = width * Bottleneck.expansion
            stage += [Bottleneck(in_ch, width) for _ in range(n - 1)]
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        x = self.layer4(self.layer3(self.layer2(self.layer1(self.stem(images)))))
        logits = self.fc(self.pool(x).flatten(1))
        return nn.functional.cross_entropy(logits, labels)
