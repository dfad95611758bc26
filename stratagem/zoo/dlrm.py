"""DLRM-like recommendation model (Naumov et al. 2019): sparse embedding tables and dense MLPs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stratagem.zoo.common import Built, DeviceLike, batch_maker, check_materializable, finish, on_device, resolve_config


@dataclass(frozen=True)
class DLRMConfig:
    tables: tuple[int, ...] = (10_000_000, 2_000_000, 500_000, 100_000)
    """Rows of each embedding table (one categorical feature each)."""
    dim: int = 64
    dense_features: int = 13
    bottom: tuple[int, ...] = (512, 256)
    """Hidden widths of the bottom MLP (dense features to `dim`)."""
    top: tuple[int, ...] = (512, 256)
    """Hidden widths of the top MLP (interactions to one logit)."""
    pooling: int = 10
    """Indices looked up per sample in each table (multi-hot, summed)."""


DLRM_PRESETS = {
    "small": DLRMConfig(tables=(20_000, 5_000, 1_000, 200), dim=16, bottom=(32,), top=(32,), pooling=2),
    "full": DLRMConfig(),
}


def _mlp(widths: list[int], *, last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for index, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if last_activation or index < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """Sparse embedding tables of different sizes, a dense bottom MLP, pairwise dot interactions, a top MLP."""

    pair_rows: torch.Tensor  # buffers: the lower triangle's indices of the feature-by-feature dot products
    pair_cols: torch.Tensor

    def __init__(self, config: DLRMConfig) -> None:
        super().__init__()
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(rows, config.dim, mode="sum", sparse=True) for rows in config.tables
        )
        self.bottom = _mlp([config.dense_features, *config.bottom, config.dim], last_activation=True)
        features = len(config.tables) + 1
        rows, cols = torch.tril_indices(features, features, offset=-1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        interactions = features * (features - 1) // 2
        self.top = _mlp([config.dim + interactions, *config.top, 1], last_activation=False)

    def forward(
        self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        x = self.bottom(dense)
        pooled = [table(indices[i], offsets) for i, table in enumerate(self.tables)]
        stacked = torch.stack([x, *pooled], dim=1)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))[:, self.pair_rows, self.pair_cols]
        logits = self.top(torch.cat([x, dots], dim=1)).squeeze(1)
        return F.binary_cross_entropy_with_logits(logits, labels)


def dlrm(size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """DLRM-like recommendation model; full: tables of 10M/2M/500k/100k rows x 64 (sparse gradients).

    Batch: (dense features [b, 13], indices [tables, b*pooling], offsets [b], labels [b]).
    """
    config = resolve_config(DLRM_PRESETS, size, overrides)
    check_materializable("dlrm", size, sum(config.tables) * config.dim, device)
    with on_device(device):
        module = DLRM(config)

    def make(batch_size: int, target: torch.device) -> tuple[torch.Tensor, ...]:
        lookups = batch_size * config.pooling
        dense = torch.randn(batch_size, config.dense_features, device=target)
        indices = torch.stack([torch.randint(0, rows, (lookups,), device=target) for rows in config.tables])
        offsets = torch.arange(0, lookups, config.pooling, device=target)
        labels = torch.randint(0, 2, (batch_size,), device=target).float()
        return dense, indices, offsets, labels

    return finish(module, batch_maker(device, make), "dlrm", size, overrides, config)
