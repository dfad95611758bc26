"""AutoDist's all-reduce builders: AllReduce, PartitionedAR, RandomAxisPartitionAR."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from stratagem.builders.base import Builder, canonical_config
from stratagem.builders.sharding import smallest_divisor
from stratagem.builders.vocabulary import COMPRESSORS, SPEC_TO_ALGORITHM, compressor_for
from stratagem.ir import AllReduceSynchronizer, ModelGraph, Partition, ResourceSpec, Strategy, Variable


@dataclass(frozen=True)
class _AllReduceBuilder(Builder):
    chunk_size: int = 128
    """Variables (or shards) per fusion group, counted in graph order: group = index // chunk_size."""
    all_reduce_spec: str = "NCCL"
    """AutoDist's spec: AUTO, NCCL (both: the runtime chooses) or RING."""
    compressor: str = "NoneCompressor"
    """AutoDist's compressor: NoneCompressor, HorovodCompressor, HorovodCompressorEF or PowerSGDCompressor."""

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise self.argument_error("chunk_size", f"must be at least 1, got {self.chunk_size}")
        if self.all_reduce_spec not in SPEC_TO_ALGORITHM:
            raise self.argument_error(
                "all_reduce_spec", f"{self.all_reduce_spec!r} is not one of {sorted(SPEC_TO_ALGORITHM)}"
            )
        if self.compressor not in COMPRESSORS:
            raise self.argument_error("compressor", f"{self.compressor!r} is not one of {sorted(COMPRESSORS)}")

    def _allreduce(self, index: int) -> AllReduceSynchronizer:
        return AllReduceSynchronizer(
            algorithm=SPEC_TO_ALGORITHM[self.all_reduce_spec],
            group=index // self.chunk_size,
            compressor=compressor_for(self.compressor),
        )


@dataclass(frozen=True)
class AllReduce(_AllReduceBuilder):
    """Every variable all-reduced; consecutive variables fused in groups of `chunk_size`."""

    def build(self, graph: ModelGraph, resources: ResourceSpec) -> Strategy:
        configs = [
            canonical_config(var.name, [self._allreduce(i)], None) for i, var in enumerate(graph.trainable_variables)
        ]
        return self._strategy(graph, resources, configs)


@dataclass(frozen=True)
class PartitionedAR(_AllReduceBuilder):
    """Axis 0 split as PartitionedPS does, each shard all-reduced; groups count shards, not variables.

    AutoDist hard-codes spec AUTO and NoneCompressor here, hence these defaults.
    """

    all_reduce_spec: str = "AUTO"

    def build(self, graph: ModelGraph, resources: ResourceSpec) -> Strategy:
        return self._build_along(graph, resources, _axis0)

    def _build_along(
        self, graph: ModelGraph, resources: ResourceSpec, choose: Callable[[Variable], tuple[int, int]]
    ) -> Strategy:
        configs, counter = [], 0
        for var in graph.trainable_variables:
            axis, shards = choose(var)
            syncs = [self._allreduce(counter + i) for i in range(shards)]
            counter += shards
            configs.append(
                canonical_config(var.name, syncs, Partition(axis=axis, shards=shards) if shards > 1 else None)
            )
        return self._strategy(graph, resources, configs)


@dataclass(frozen=True)
class RandomAxisPartitionAR(PartitionedAR):
    """PartitionedAR along a random axis of length > 1 per variable (axis 0 for sparse ones), seeded.

    The random draw happens, as in AutoDist, only for dense variables with some axis longer than 1,
    so the same seed gives the same strategy for the same graph.
    """

    seed: int = 0

    def build(self, graph: ModelGraph, resources: ResourceSpec) -> Strategy:
        rng = random.Random(self.seed)

        def choose(var: Variable) -> tuple[int, int]:
            long_axes = [axis for axis, length in enumerate(var.shape) if length > 1]
            if not long_axes:
                return 0, 1
            axis = 0 if var.sparse else long_axes[rng.randrange(len(long_axes))]
            return axis, smallest_divisor(var.shape[axis])

        return self._build_along(graph, resources, choose)


def _axis0(var: Variable) -> tuple[int, int]:
    return 0, (smallest_divisor(var.shape[0]) if var.shape else 1)
