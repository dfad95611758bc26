"""VGG-16-like CNN (Simonyan and Zisserman 2015)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stratagem.zoo.common import Built, DeviceLike, build_image_classifier


@dataclass(frozen=True)
class VGGConfig:
    convs: tuple[int, ...] = (2, 2, 3, 3, 3)
    """3x3 convolutions per stage, each stage ending in a 2x2 max-pool (VGG-16: 2, 2, 3, 3, 3)."""
    width: int = 64
    """Channels of the first stage; doubled per stage up to 8x."""
    hidden: int = 4096
    image_size: int = 224
    pool_size: int = 7
    num_classes: int = 1000


VGG_PRESETS = {
    "small": VGGConfig(width=8, hidden=64, image_size=32, pool_size=1, num_classes=10),
    "full": VGGConfig(),
}


class VGG(nn.Module):
    def __init__(self, config: VGGConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for index, count in enumerate(config.convs):
            width = config.width * 2 ** min(index, 3)
            for _ in range(count):
                layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
                channels = width
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(config.pool_size)
        self.classifier = nn.Sequential(
            nn.Linear(channels * config.pool_size**2, config.hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(config.hidden, config.hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(config.hidden, config.num_classes),
        )

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        features = self.pool(self.features(images)).flatten(1)
        return F.cross_entropy(self.classifier(features), labels)


def vgg16(size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """VGG-16-like CNN: 13 3x3 convolutions in 5 stages and a 3-layer classifier; small: 8 base channels."""
    return build_image_classifier("vgg16", VGG, VGG_PRESETS, size, device, overrides)
