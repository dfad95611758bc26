"""Inception-v3-like CNN (Szegedy et al. 2016), as torchvision's `inception_v3` lays it out, without the
auxiliary classifier (as Keras' InceptionV3, which AutoDist's benchmark trains, has none)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stratagem.zoo.common import Built, DeviceLike, build_image_classifier

Kernel = int | tuple[int, int]


@dataclass(frozen=True)
class InceptionConfig:
    divisor: int = 1
    """Every convolution's channels are divided by this (1: Inception-v3's own widths)."""
    image_size: int = 299
    """Input side; 75 is the smallest the stem and the two grid reductions take."""
    num_classes: int = 1000


INCEPTION_PRESETS = {
    "small": InceptionConfig(divisor=16, image_size=75, num_classes=10),
    "full": InceptionConfig(),
}


class BasicConv(nn.Module):
    """Convolution without bias, batch norm (eps 0.001), ReLU: every convolution of Inception-v3."""

    def __init__(self, in_channels: int, out_channels: int, kernel: Kernel, stride: int = 1, padding: Kernel = 0):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class InceptionA(nn.Module):
    """35x35 grid: 1x1, 5x5, double 3x3 and pooled branches."""

    def __init__(self, c: Any, in_channels: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv(in_channels, c(64), 1)
        self.branch5x5_1 = BasicConv(in_channels, c(48), 1)
        self.branch5x5_2 = BasicConv(c(48), c(64), 5, padding=2)
        self.branch3x3dbl_1 = BasicConv(in_channels, c(64), 1)
        self.branch3x3dbl_2 = BasicConv(c(64), c(96), 3, padding=1)
        self.branch3x3dbl_3 = BasicConv(c(96), c(96), 3, padding=1)
        self.branch_pool = BasicConv(in_channels, c(pool_features), 1)
        self.out_channels = c(64) + c(64) + c(96) + c(pool_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch5x5 = self.branch5x5_2(self.branch5x5_1(x))
        branch3x3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        pool = self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.branch1x1(x), branch5x5, branch3x3, pool], 1)


class InceptionB(nn.Module):
    """Grid reduction 35x35 -> 17x17."""

    def __init__(self, c: Any, in_channels: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv(in_channels, c(384), 3, stride=2)
        self.branch3x3dbl_1 = BasicConv(in_channels, c(64), 1)
        self.branch3x3dbl_2 = BasicConv(c(64), c(96), 3, padding=1)
        self.branch3x3dbl_3 = BasicConv(c(96), c(96), 3, stride=2)
        self.out_channels = c(384) + c(96) + in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch3x3dbl = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([self.branch3x3(x), branch3x3dbl, F.max_pool2d(x, 3, stride=2)], 1)


class InceptionC(nn.Module):
    """17x17 grid: factorized 7x7 convolutions (1x7 then 7x1)."""

    def __init__(self, c: Any, in_channels: int, channels_7x7: int) -> None:
        super().__init__()
        c7 = c(channels_7x7)
        self.branch1x1 = BasicConv(in_channels, c(192), 1)
        self.branch7x7_1 = BasicConv(in_channels, c7, 1)
        self.branch7x7_2 = BasicConv(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv(c7, c(192), (7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv(in_channels, c7, 1)
        self.branch7x7dbl_2 = BasicConv(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv(c7, c(192), (1, 7), padding=(0, 3))
        self.branch_pool = BasicConv(in_channels, c(192), 1)
        self.out_channels = 4 * c(192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch7x7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        double = self.branch7x7dbl_1(x)
        for conv in (self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4, self.branch7x7dbl_5):
            double = conv(double)
        pool = self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.branch1x1(x), branch7x7, double, pool], 1)


class InceptionD(nn.Module):
    """Grid reduction 17x17 -> 8x8."""

    def __init__(self, c: Any, in_channels: int) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv(in_channels, c(192), 1)
        self.branch3x3_2 = BasicConv(c(192), c(320), 3, stride=2)
        self.branch7x7x3_1 = BasicConv(in_channels, c(192), 1)
        self.branch7x7x3_2 = BasicConv(c(192), c(192), (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv(c(192), c(192), (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv(c(192), c(192), 3, stride=2)
        self.out_channels = c(320) + c(192) + in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch3x3 = self.branch3x3_2(self.branch3x3_1(x))
        branch7x7x3 = self.branch7x7x3_1(x)
        for conv in (self.branch7x7x3_2, self.branch7x7x3_3, self.branch7x7x3_4):
            branch7x7x3 = conv(branch7x7x3)
        return torch.cat([branch3x3, branch7x7x3, F.max_pool2d(x, 3, stride=2)], 1)


class InceptionE(nn.Module):
    """8x8 grid: expanded filter banks (1x3 and 3x1 side by side)."""

    def __init__(self, c: Any, in_channels: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv(in_channels, c(320), 1)
        self.branch3x3_1 = BasicConv(in_channels, c(384), 1)
        self.branch3x3_2a = BasicConv(c(384), c(384), (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv(c(384), c(384), (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv(in_channels, c(448), 1)
        self.branch3x3dbl_2 = BasicConv(c(448), c(384), 3, padding=1)
        self.branch3x3dbl_3a = BasicConv(c(384), c(384), (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv(c(384), c(384), (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv(in_channels, c(192), 1)
        self.out_channels = c(320) + 4 * c(384) + c(192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        single = self.branch3x3_1(x)
        double = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        pool = self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch3x3_2a(single),
                self.branch3x3_2b(single),
                self.branch3x3dbl_3a(double),
                self.branch3x3dbl_3b(double),
                pool,
            ],
            1,
        )


class InceptionV3(nn.Module):
    def __init__(self, config: InceptionConfig) -> None:
        super().__init__()

        def c(channels: int) -> int:
            return max(1, channels // config.divisor)

        self.stem = nn.Sequential(
            BasicConv(3, c(32), 3, stride=2),
            BasicConv(c(32), c(32), 3),
            BasicConv(c(32), c(64), 3, padding=1),
            nn.MaxPool2d(3, stride=2),
            BasicConv(c(64), c(80), 1),
            BasicConv(c(80), c(192), 3),
            nn.MaxPool2d(3, stride=2),
        )
        mixed: list[nn.Module] = []
        channels = c(192)
        for make in (
            lambda n: InceptionA(c, n, 32),
            lambda n: InceptionA(c, n, 64),
            lambda n: InceptionA(c, n, 64),
            lambda n: InceptionB(c, n),
            lambda n: InceptionC(c, n, 128),
            lambda n: InceptionC(c, n, 160),
            lambda n: InceptionC(c, n, 160),
            lambda n: InceptionC(c, n, 192),
            lambda n: InceptionD(c, n),
            lambda n: InceptionE(c, n),
            lambda n: InceptionE(c, n),
        ):
            block = make(channels)
            mixed.append(block)
            channels = block.out_channels
        self.mixed = nn.Sequential(*mixed)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(channels, config.num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        features = F.adaptive_avg_pool2d(self.mixed(self.stem(images)), 1).flatten(1)
        return F.cross_entropy(self.fc(self.dropout(features)), labels)


def inception_v3(size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """Inception-v3-like CNN: the factorized stem, three 35x35, four 17x17 and two 8x8 Inception modules
    with two grid reductions (23.8M parameters at 299x299); small: channels / 16, 75x75 images."""
    return build_image_classifier("inception_v3", InceptionV3, INCEPTION_PRESETS, size, device, overrides)
