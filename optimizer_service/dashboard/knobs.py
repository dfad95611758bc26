"""A strategy reduced to the few numbers the trials page's parallel-coordinates chart compares.

Bytes-weighted where bytes matter: "30% of the bytes go through parameter servers" says more about
a strategy's traffic than "2 of 6 variables", since one embedding table can outweigh everything else.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer_service.dashboard.placement import shards
from stratagem.ir import AllReduceSynchronizer, ModelGraph, PSSynchronizer, ShardedSynchronizer, Strategy

ASP_STALENESS = -1
"""How an ASP strategy's (unbounded) staleness is plotted; the axis labels it `asp`."""


@dataclass(frozen=True)
class Knobs:
    ps_bytes_fraction: float
    """Of the synchronized bytes, the part that goes through parameter servers."""
    groups: int
    """Distinct all-reduce and sharded fusion groups (the collectives launched per step)."""
    max_shards: int
    """Most shards any one variable is split into (1: nothing is partitioned)."""
    compressed_fraction: float
    """Of the synchronized bytes, the part a lossy compressor shrinks."""
    staleness: int
    """0 under BSP, the bound under SSP, ASP_STALENESS under ASP."""


def knobs_of(strategy: Strategy, graph: ModelGraph) -> Knobs:
    total = ps = compressed = 0.0
    groups: set[tuple[str, int]] = set()
    for piece in shards(strategy, graph):
        size = piece.nbytes or 0.0
        total += size
        sync = piece.sync
        if isinstance(sync, PSSynchronizer):
            ps += size
        elif isinstance(sync, AllReduceSynchronizer):
            groups.add(("allreduce", sync.group))
            if sync.compressor.kind != "none":
                compressed += size
        elif isinstance(sync, ShardedSynchronizer):
            groups.add(("sharded", sync.group))
    consistency = strategy.consistency
    staleness = ASP_STALENESS if consistency.kind == "asp" else consistency.staleness
    return Knobs(
        ps_bytes_fraction=ps / total if total else 0.0,
        groups=len(groups),
        max_shards=max((c.num_shards for c in strategy.variables), default=1),
        compressed_fraction=compressed / total if total else 0.0,
        staleness=staleness,
    )
