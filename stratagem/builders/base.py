"""What every pre-built strategy builder shares: the interface, the strategy envelope, the PS servers.

A builder is a small frozen dataclass whose fields are AutoDist's constructor arguments, so
`PSLoadBalancing(sync=False)` reads the same in both systems and `repr()` says exactly what was built.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from stratagem.errors import InvalidResourceSpecError, InvalidStrategyError, Problem
from stratagem.ir import (
    AllReduceSynchronizer,
    Consistency,
    ModelGraph,
    Partition,
    Provenance,
    PSSynchronizer,
    ResourceSpec,
    ShardedSynchronizer,
    Strategy,
    VariableConfig,
)

AnySynchronizer = AllReduceSynchronizer | PSSynchronizer | ShardedSynchronizer


class Builder(ABC):
    """Turns a graph and a cluster into a Strategy by a fixed rule (no search, no simulation)."""

    @abstractmethod
    def build(self, graph: ModelGraph, resources: ResourceSpec) -> Strategy:
        """The strategy this rule gives for `graph` on `resources`."""

    @property
    def name(self) -> str:
        return type(self).__name__

    def _strategy(
        self,
        graph: ModelGraph,
        resources: ResourceSpec,
        variables: list[VariableConfig],
        consistency: Consistency | None = None,
    ) -> Strategy:
        """Every builder runs plain data parallel over all compute devices; only synchronization differs."""
        return Strategy(
            graph_id=graph.id,
            resources_id=resources.id,
            replicas=resources.compute_devices,
            consistency=consistency or Consistency(),
            variables=variables,
            provenance=Provenance(builder=self.name, notes=[repr(self)]),
        )

    def argument_error(self, field: str, reason: str) -> InvalidStrategyError:
        """The error for a bad constructor argument, named `<Builder>.<argument>`."""
        return InvalidStrategyError([Problem(f"{self.name}.{field}", reason)])


def ps_servers(resources: ResourceSpec) -> list[str]:
    """One parameter server per node, on its first CPU, in the order the nodes are listed.

    AutoDist puts its servers on each node's `CPU:0`; a node that lists no CPU cannot host one.
    """
    servers, problems = [], []
    for i, node in enumerate(resources.nodes):
        if not node.cpus:
            problems.append(Problem(f"nodes[{i}].cpus", "lists no CPU, so the node cannot host a parameter server"))
            continue
        servers.append(f"{node.address}:CPU:{min(node.cpus)}")
    if problems:
        raise InvalidResourceSpecError(problems)
    return servers


def check_sync_params(builder: Builder, sync: bool, staleness: int) -> None:
    """AutoDist's rule: staleness bounds how far a *synchronous* worker may run ahead."""
    if staleness < 0:
        raise builder.argument_error("staleness", f"must be >= 0, got {staleness}")
    if staleness > 0 and not sync:
        raise builder.argument_error(
            "staleness", f"is {staleness} but sync is False; a staleness bound needs sync=True"
        )


def consistency_of(sync: bool, staleness: int) -> Consistency:
    """AutoDist's per-variable flags as Stratagem's one consistency model."""
    if not sync:
        return Consistency(kind="asp")
    if staleness > 0:
        return Consistency(kind="ssp", staleness=staleness)
    return Consistency(kind="bsp")


def ps_synchronizer(destination: str, *, local_replication: bool, sync: bool, staleness: int) -> PSSynchronizer:
    return PSSynchronizer(
        reduction_destination=destination, local_replication=local_replication, sync=sync, staleness=staleness
    )


def canonical_config(
    var_name: str, shard_synchronizers: Sequence[AnySynchronizer], partition: Partition | None
) -> VariableConfig:
    """The one way to write a (possibly partitioned) variable, so equal strategies get equal ids.

    Per-shard overrides are kept only when the shards differ; otherwise the shared synchronizer
    says it all. With overrides, the variable's own synchronizer is the first shard's.
    """
    first = shard_synchronizers[0]
    if partition is None:
        return VariableConfig(var_name=var_name, synchronizer=first)
    if all(sync == first for sync in shard_synchronizers):
        return VariableConfig(var_name=var_name, synchronizer=first, partition=partition)
    return VariableConfig(
        var_name=var_name,
        synchronizer=first.model_copy(deep=True),
        partition=partition,
        shard_synchronizers=list(shard_synchronizers),
    )
