"""Which part of the global batch a rank trains on."""

from __future__ import annotations

import torch

from stratagem.errors import UnsupportedStrategyError


def local_batch(batch: torch.Tensor, *, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s equal slice of a global batch along dim 0.

    Equal slices are what make the mean over ranks of per-rank mean losses equal the global mean.
    """
    if batch.shape[0] % world_size:
        raise UnsupportedStrategyError(
            f"global batch of {batch.shape[0]} does not split evenly over {world_size} ranks; use a multiple of {world_size}"
        )
    size = batch.shape[0] // world_size
    return batch[rank * size : (rank + 1) * size]
