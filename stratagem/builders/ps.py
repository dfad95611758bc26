"""AutoDist's parameter-server builders: PS, PSLoadBalancing, PartitionedPS, UnevenPartitionedPS."""

from __future__ import annotations

from dataclasses import dataclass

from stratagem.builders.base import (
    Builder,
    canonical_config,
    check_sync_params,
    consistency_of,
    ps_servers,
    ps_synchronizer,
)
from stratagem.builders.sharding import GreedyLoads, smallest_divisor, smallest_non_divisor
from stratagem.ir import ModelGraph, Partition, PSSynchronizer, ResourceSpec, Strategy, VariableConfig


@dataclass(frozen=True)
class _PSBuilder(Builder):
    local_proxy_variable: bool = False
    """Keep a proxy copy of each variable on every node and aggregate there first (local replication)."""
    sync: bool = True
    """False: asynchronous (ASP) updates."""
    staleness: int = 0
    """> 0: stale-synchronous (SSP) with this bound."""

    def __post_init__(self) -> None:
        check_sync_params(self, self.sync, self.staleness)

    def _ps(self, destination: str) -> PSSynchronizer:
        return ps_synchronizer(
            destination, local_replication=self.local_proxy_variable, sync=self.sync, staleness=self.staleness
        )

    def _finish(self, graph: ModelGraph, resources: ResourceSpec, configs: list[VariableConfig]) -> Strategy:
        return self._strategy(graph, resources, configs, consistency_of(self.sync, self.staleness))


@dataclass(frozen=True)
class PS(_PSBuilder):
    """Every variable on one server: the first listed node's CPU (AutoDist's `cpu_devices[0]`)."""

    def build(self, graph: ModelGraph, resources: ResourceSpec) -> Strategy:
        server = ps_servers(resources)[0]
        configs = [VariableConfig(var_name=v.name, synchronizer=self._ps(server)) for v in graph.trainable_variables]
        return self._finish(graph, resources, configs)


@dataclass(frozen=True)
class PSLoadBalancing(_PSBuilder):
    """Each variable, in graph order, whole onto the server (one per node) holding the fewest bytes so far."""

    def build(self, graph: ModelGraph, resources: ResourceSpec) -> Strategy:
        loads = GreedyLoads(ps_servers(resources))
        configs = [
            VariableConfig(var_name=v.name, synchronizer=self._ps(loads.place(v.nbytes)))
            for v in graph.trainable_variables
        ]
        return self._finish(graph, resources, configs)


@dataclass(frozen=True)
class PartitionedPS(_PSBuilder):
    """Axis 0 split into its smallest divisor >= 2 of shards; shards greedily onto the least-loaded servers.

    AutoDist does not cap the shard count by the number of servers (a dim 0 of 7 makes 7 shards on
    2 servers, placed round-robin in load order), and partitions even on a single node.
    """

    def build(self, graph: ModelGraph, resources: ResourceSpec) -> Strategy:
        loads = GreedyLoads(ps_servers(resources))
        configs = []
        for var in graph.trainable_variables:
            shards = self.shard_count(var.shape)
            destinations = loads.place_shards(shards, var.nbytes)
            partition = Partition(axis=0, shards=shards) if shards > 1 else None
            configs.append(canonical_config(var.name, [self._ps(d) for d in destinations], partition))
        return self._finish(graph, resources, configs)

    def shard_count(self, shape: list[int]) -> int:
        """Shards along axis 0; scalars are never partitioned."""
        return smallest_divisor(shape[0]) if shape else 1


@dataclass(frozen=True)
class UnevenPartitionedPS(PartitionedPS):
    """As PartitionedPS, but into the smallest NON-divisor >= 2 of dim 0 (64 -> 3), so shards are uneven."""

    def shard_count(self, shape: list[int]) -> int:
        return smallest_non_divisor(shape[0]) if shape else 1
