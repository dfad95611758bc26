"""AutoDist's pre-built strategies, with its exact rules, plus plain DDP as a baseline.

    builder = PartitionedPS()
    strategy = builder.build(graph, resources)      # a validated Strategy, provenance.builder set

The search seeds every job with `all_builders()` so a returned strategy is never predicted slower
than the best of them. The rules, and where they differ from a naive reading, are in
`docs/strategies.md`.
"""

from __future__ import annotations

from stratagem.builders.allreduce import AllReduce, PartitionedAR, RandomAxisPartitionAR
from stratagem.builders.base import Builder, canonical_config, ps_servers
from stratagem.builders.data_parallel import DataParallel, ddp_buckets
from stratagem.builders.parallax import Parallax
from stratagem.builders.ps import PS, PartitionedPS, PSLoadBalancing, UnevenPartitionedPS
from stratagem.builders.sharding import GreedyLoads, smallest_divisor, smallest_non_divisor

BUILDERS: dict[str, type[Builder]] = {
    cls.__name__: cls
    for cls in (
        PS,
        PSLoadBalancing,
        PartitionedPS,
        UnevenPartitionedPS,
        AllReduce,
        PartitionedAR,
        RandomAxisPartitionAR,
        Parallax,
        DataParallel,
    )
}
"""Every builder by class name (the name `provenance.builder` records)."""


def all_builders() -> list[Builder]:
    """One default-constructed instance of each builder, in `BUILDERS` order: the search's baselines."""
    return [cls() for cls in BUILDERS.values()]


__all__ = [
    "BUILDERS",
    "PS",
    "AllReduce",
    "Builder",
    "DataParallel",
    "GreedyLoads",
    "PSLoadBalancing",
    "Parallax",
    "PartitionedAR",
    "PartitionedPS",
    "RandomAxisPartitionAR",
    "UnevenPartitionedPS",
    "all_builders",
    "canonical_config",
    "ddp_buckets",
    "ps_servers",
    "smallest_divisor",
    "smallest_non_divisor",
]
