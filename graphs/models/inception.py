"""Inception-v3 (Szegedy et al. 2016), the full architecture, 299x299 input.

Stem, three InceptionA blocks (35x35), a grid reduction, four factorised-7x7
InceptionC blocks (17x17), the auxiliary classifier, a second reduction, two
expanded-filter-bank InceptionE blocks (8x8), then pooling and the classifier.
Training loss: main cross entropy + 0.4 x auxiliary cross entropy.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ConvBN(nn.Module):
    """Convolution (no bias) + batch norm + ReLU, the unit every block is built of."""

    def __init__(self, in_ch: int, out_ch: int, kernel, stride: int = 1, padding=0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_ch, eps=0.001)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.bn(self.conv(x)))


def _avg_pool_branch(in_ch: int, out_ch: int) -> nn.Sequential:
    return nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1), ConvBN(in_ch, out_ch, 1))


class InceptionA(nn.Module):
    def __init__(self, in_ch: int, pool_ch: int) -> None:
        super().__init__()
        self.b1 = ConvBN(in_ch, 64, 1)
        self.b5 = nn.Sequential(ConvBN(in_ch, 48, 1), ConvBN(48, 64, 5, padding=2))
        self.b3 = nn.Sequential(ConvBN(in_ch, 64, 1), ConvBN(64, 96, 3, padding=1), ConvBN(96, 96, 3, padding=1))
        self.pool = _avg_pool_branch(in_ch, pool_ch)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), self.pool(x)], dim=1)


class InceptionB(nn.Module):
    """Grid reduction 35x35 -> 17x17."""

    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.b3 = ConvBN(in_ch, 384, 3, stride=2)
        self.b3dbl = nn.Sequential(ConvBN(in_ch, 64, 1), ConvBN(64, 96, 3, padding=1), ConvBN(96, 96, 3, stride=2))
        self.pool = nn.MaxPool2d(3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.b3(x), self.b3dbl(x), self.pool(x)], dim=1)


class InceptionC(nn.Module):
    """17x17 block with 7x7 convolutions factorised into 1x7 and 7x1."""

    def __init__(self, in_ch: int, mid: int) -> None:
        super().__init__()
        row = {"kernel": (1, 7), "padding": (0, 3)}
        col = {"kernel": (7, 1), "padding": (3, 0)}
        self.b1 = ConvBN(in_ch, 192, 1)
        self.b7 = nn.Sequential(ConvBN(in_ch, mid, 1), ConvBN(mid, mid, **row), ConvBN(mid, 192, **col))
        self.b7dbl = nn.Sequential(
            ConvBN(in_ch, mid, 1),
            ConvBN(mid, mid, **col),
            ConvBN(mid, mid, **row),
            ConvBN(mid, mid, **col),
            ConvBN(mid, 192, **row),
        )
        self.pool = _avg_pool_branch(in_ch, 192)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.b1(x), self.b7(x), self.b7dbl(x), self.pool(x)], dim=1)


class InceptionD(nn.Module):
    """Grid reduction 17x17 -> 8x8."""

    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.b3 = nn.Sequential(ConvBN(in_ch, 192, 1), ConvBN(192, 320, 3, stride=2))
        self.b7x3 = nn.Sequential(
            ConvBN(in_ch, 192, 1),
            ConvBN(192, 192, (1, 7), padding=(0, 3)),
            ConvBN(192, 192, (7, 1), padding=(3, 0)),
            ConvBN(192, 192, 3, stride=2),
        )
        self.pool = nn.MaxPool2d(3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.b3(x), self.b7x3(x), self.pool(x)], dim=1)


class InceptionE(nn.Module):
    """8x8 block with expanded filter banks (1x3 and 3x1 side by side)."""

    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.b1 = ConvBN(in_ch, 320, 1)
        self.b3 = ConvBN(in_ch, 384, 1)
        self.b3_row = ConvBN(384, 384, (1, 3), padding=(0, 1))
        self.b3_col = ConvBN(384, 384, (3, 1), padding=(1, 0))
        self.b3dbl = nn.Sequential(ConvBN(in_ch, 448, 1), ConvBN(448, 384, 3, padding=1))
        self.b3dbl_row = ConvBN(384, 384, (1, 3), padding=(0, 1))
        self.b3dbl_col = ConvBN(384, 384, (3, 1), padding=(1, 0))
        self.pool = _avg_pool_branch(in_ch, 192)

    def forward(self, x: Tensor) -> Tensor:
        a = self.b3(x)
        d = self.b3dbl(x)
        parts = [self.b1(x), self.b3_row(a), self.b3_col(a), self.b3dbl_row(d), self.b3dbl_col(d), self.pool(x)]
        return torch.cat(parts, dim=1)


class AuxClassifier(nn.Module):
    def __init__(self, in_ch: int, num_classes: int) -> None:
        super().__init__()
        self.pool = nn.AvgPool2d(5, stride=3)
        self.conv0 = ConvBN(in_ch, 128, 1)
        self.conv1 = ConvBN(128, 768, 5)
        self.fc = nn.Linear(768, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(self.conv0(self.pool(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class InceptionV3(nn.Module):
    def __init__(self, num_classes: int = 1000, aux_weight: float = 0.4) -> None:
        super().__init__()
        self.aux_weight = aux_weight
        self.stem = nn.Sequential(
            ConvBN(3, 32, 3, stride=2),
            ConvBN(32, 32, 3),
            ConvBN(32, 64, 3, padding=1),
            nn.MaxPool2d(3, stride=2),
            ConvBN(64, 80, 1),
            ConvBN(80, 192, 3),
            nn.MaxPool2d(3, stride=2),
        )
        self.mixed_5 = nn.Sequential(InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64))
        self.mixed_6 = nn.Sequential(
            InceptionB(288), InceptionC(768, 128), InceptionC(768, 160), InceptionC(768, 160), InceptionC(768, 192)
        )
        self.aux = AuxClassifier(768, num_classes)
        self.mixed_7 = nn.Sequential(InceptionD(768), InceptionE(1280), InceptionE(2048))
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        """``images`` [batch, 3, 299, 299], ``labels`` [batch] int64 -> training loss."""
        x = self.mixed_6(self.mixed_5(self.stem(images)))
        aux_logits = self.aux(x)
        x = self.mixed_7(x)
        logits = self.fc(self.dropout(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)))
        loss = nn.functional.cross_entropy(logits, labels)
        return loss + self.aux_weight * nn.functional.cross_entropy(aux_logits, labels)
