"""DenseNet-121-like CNN with dense blocks (Huang et al. 2017), as torchvision's `densenet121` lays it out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stratagem.zoo.common import Built, DeviceLike, Stem, build_image_classifier, image_stem


@dataclass(frozen=True)
class DenseNetConfig:
    blocks: tuple[int, ...] = (6, 12, 24, 16)
    """Dense layers per block (DenseNet-121: 6, 12, 24, 16)."""
    growth: int = 32
    """Channels each dense layer adds to its block's running concatenation (k in the paper)."""
    init_features: int = 64
    """Channels of the stem convolution."""
    bottleneck: int = 4
    """A dense layer's 1x1 convolution widens to bottleneck × growth channels before its 3x3 (DenseNet-B)."""
    image_size: int = 224
    num_classes: int = 1000
    stem: Stem = "imagenet"
    """`imagenet`: 7x7 stride-2 conv and max-pool; `cifar`: one 3x3 conv, for 32x32 images."""


DENSENET_PRESETS = {
    "small": DenseNetConfig(
        blocks=(1, 1, 1, 1), growth=8, init_features=16, bottleneck=2, image_size=32, num_classes=10, stem="cifar"
    ),
    "full": DenseNetConfig(),
}


class DenseLayer(nn.Module):
    """BN-ReLU-1x1 conv to bottleneck × growth channels, BN-ReLU-3x3 conv to growth channels."""

    def __init__(self, in_channels: int, growth: int, bottleneck: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, bottleneck * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bottleneck * growth)
        self.conv2 = nn.Conv2d(bottleneck * growth, growth, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.norm1(x)))
        return self.conv2(F.relu(self.norm2(out)))


class DenseBlock(nn.Module):
    def __init__(self, layers: int, in_channels: int, growth: int, bottleneck: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(in_channels + i * growth, growth, bottleneck) for i in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.cat([x, layer(x)], dim=1)
        return x


class Transition(nn.Module):
    """BN-ReLU-1x1 conv halving the channels, then a 2x2 average pool (compression 0.5)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(in_channels)
        self.conv = nn.Conv2d(in_channels, out_channels, 1, bias=False)
        self.pool = nn.AvgPool2d(2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.conv(F.relu(self.norm(x))))


class DenseNet(nn.Module):
    def __init__(self, config: DenseNetConfig) -> None:
        super().__init__()
        channels = config.init_features
        self.stem = image_stem(channels, config.stem)
        stages: list[nn.Module] = []
        for index, layers in enumerate(config.blocks):
            stages.append(DenseBlock(layers, channels, config.growth, config.bottleneck))
            channels += layers * config.growth
            if index < len(config.blocks) - 1:
                stages.append(Transition(channels, channels // 2))
                channels //= 2
        self.stages = nn.Sequential(*stages)
        self.norm = nn.BatchNorm2d(channels)
        self.fc = nn.Linear(channels, config.num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        features = F.relu(self.norm(self.stages(self.stem(images))))
        features = F.adaptive_avg_pool2d(features, 1).flatten(1)
        return F.cross_entropy(self.fc(features), labels)


def densenet121(size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """DenseNet-121-like CNN: four dense blocks of 6, 12, 24 and 16 layers (growth 32, 8.0M parameters);
    small: one 8-channel-growth layer per block, 32x32 images."""
    return build_image_classifier("densenet121", DenseNet, DENSENET_PRESETS, size, device, overrides)
