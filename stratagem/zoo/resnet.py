"""ResNet-50-like CNN with bottleneck blocks (He et al. 2016)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stratagem.zoo.common import Built, DeviceLike, Stem, build_image_classifier, image_stem


@dataclass(frozen=True)
class ResNetConfig:
    blocks: tuple[int, ...] = (3, 4, 6, 3)
    """Bottleneck blocks per stage (ResNet-50: 3, 4, 6, 3)."""
    width: int = 64
    """Channels of the first stage; each later stage doubles it, bottlenecks expand 4x."""
    image_size: int = 224
    num_classes: int = 1000
    stem: Stem = "imagenet"
    """`imagenet`: 7x7 stride-2 conv and max-pool; `cifar`: one 3x3 conv, for 32x32 images."""


RESNET_PRESETS = {
    "small": ResNetConfig(blocks=(1, 1, 1, 1), width=8, image_size=32, num_classes=10, stem="cifar"),
    "full": ResNetConfig(),
}


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, config: ResNetConfig) -> None:
        super().__init__()
        w = config.width
        self.stem = image_stem(w, config.stem)
        stages: list[nn.Module] = []
        channels = w
        for index, count in enumerate(config.blocks):
            width = w * 2**index
            blocks = []
            for block in range(count):
                blocks.append(Bottleneck(channels, width, stride=2 if index > 0 and block == 0 else 1))
                channels = width * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, config.num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        features = self.pool(self.stages(self.stem(images))).flatten(1)
        return F.cross_entropy(self.fc(features), labels)


def resnet50(size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """ResNet-50-like CNN with bottleneck blocks; small: 8 base channels, one block per stage, 32x32."""
    return build_image_classifier("resnet50", ResNet, RESNET_PRESETS, size, device, overrides)
