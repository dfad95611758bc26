"""Fixed-size numeric summaries of a graph, a cluster and a strategy.

The cost model learns across jobs, so it cannot see per-variable detail (every graph has a different
number of variables). These summaries are what transfers: how big the model is, how fast the cluster
is, and which share of the bytes each kind of synchronization carries. They are computed once, when a
trial is recorded, and stored in the training record, so a record stays meaningful without the
documents it came from.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from stratagem.ir import ModelGraph, PSSynchronizer, ResourceSpec, Strategy, shard_numel
from stratagem.ir.catalog import lookup

DEVICE_CODES: dict[str, int] = {
    "CPU": 0,
    "T4": 1,
    "V100-16GB": 2,
    "V100": 3,
    "A100-40GB": 4,
    "A100-80GB": 5,
    "H100": 6,
    "H100-SXM-96GB-HBM2e": 6,
    "H200": 7,
}
"""Catalog device kinds as ordinal codes, roughly by generation; unknown GPUs are -1, CPUs 0."""

CONSISTENCY_CODES: dict[str, int] = {"bsp": 0, "ssp": 1, "asp": 2}


class _Summary(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GraphSummary(_Summary):
    num_parameters: float = Field(ge=0)
    parameter_bytes: float = Field(ge=0)
    flops_per_step: float = Field(ge=0)
    """Forward plus backward FLOPs of one replica at `batch_size`."""
    sparse_share: float = Field(ge=0, le=1)
    """Fraction of parameter bytes held by sparse (embedding) variables."""
    batch_size: float = Field(gt=0)
    num_layers: float = Field(ge=0)
    num_variables: float = Field(ge=0)
    activation_bytes: float = Field(default=0.0, ge=0)


class ClusterSummary(_Summary):
    num_devices: float = Field(gt=0)
    num_nodes: float = Field(gt=0)
    min_bandwidth_bytes_per_s: float = Field(gt=0)
    """Slowest link any collective may cross (a NIC when there are several nodes)."""
    max_bandwidth_bytes_per_s: float = Field(gt=0)
    device_code: float
    """`DEVICE_CODES` of the slowest node's device kind."""
    peak_flops: float = Field(gt=0)
    """Peak FLOP/s of one device of the slowest node, at fp32."""
    memory_bandwidth_bytes_per_s: float = Field(gt=0)
    device_memory_bytes: float = Field(gt=0)
    """Memory of one device of the smallest node: what the memory headroom is measured against."""


class StrategySummary(_Summary):
    ps_fraction: float = Field(ge=0, le=1)
    """Fraction of trainable parameter bytes synchronized through parameter servers."""
    allreduce_fraction: float = Field(ge=0, le=1)
    sharded_fraction: float = Field(ge=0, le=1)
    compressed_fraction: float = Field(ge=0, le=1)
    """Fraction of all-reduced bytes that go through a compressor."""
    local_replication_fraction: float = Field(ge=0, le=1)
    """Fraction of PS bytes aggregated inside a node before the push."""
    num_shards: float = Field(ge=0)
    """Total number of pieces that travel (an unpartitioned variable is one)."""
    num_partitioned: float = Field(ge=0)
    num_groups: float = Field(ge=0)
    """Distinct all-reduce and sharded fusion groups."""
    num_ps_servers: float = Field(ge=0)
    max_server_share: float = Field(ge=0, le=1)
    """Largest fraction of PS bytes held by one server (1 = everything on one server)."""
    consistency_code: float
    staleness: float = Field(ge=0)
    data_degree: float = Field(ge=1)
    tensor_degree: float = Field(ge=1)
    pipeline_degree: float = Field(ge=1)
    micro_batches: float = Field(ge=1)


def summarize_graph(graph: ModelGraph) -> GraphSummary:
    total_bytes = float(graph.parameter_bytes)
    sparse_bytes = float(sum(v.nbytes for v in graph.variables if v.sparse))
    return GraphSummary(
        num_parameters=float(graph.num_parameters),
        parameter_bytes=total_bytes,
        flops_per_step=float(graph.total_flops),
        sparse_share=sparse_bytes / total_bytes if total_bytes > 0 else 0.0,
        batch_size=float(graph.batch_size),
        num_layers=float(len(graph.layers)),
        num_variables=float(len(graph.variables)),
        activation_bytes=float(sum(layer.activation_bytes for layer in graph.layers)),
    )


def device_code(kind: str, is_gpu: bool) -> int:
    if not is_gpu:
        return 0
    spec = lookup(kind)
    return DEVICE_CODES.get(spec.name if spec else kind, -1)


def summarize_resources(resources: ResourceSpec) -> ClusterSummary:
    links = [resources.intra_link(node).bytes_per_s for node in resources.nodes]
    if len(resources.nodes) > 1:
        links += [resources.nic(node).bytes_per_s for node in resources.nodes]
    specs = [(node, resources.node_device_spec(node)) for node in resources.nodes]
    slowest_node, slowest = min(specs, key=lambda item: item[1].flops_for("float32"))
    return ClusterSummary(
        num_devices=float(resources.num_devices),
        num_nodes=float(len(resources.nodes)),
        min_bandwidth_bytes_per_s=min(links),
        max_bandwidth_bytes_per_s=max(links),
        device_code=float(device_code(slowest_node.device_kind, slowest.is_gpu)),
        peak_flops=slowest.flops_for("float32"),
        memory_bandwidth_bytes_per_s=slowest.memory_bandwidth,
        device_memory_bytes=min(spec.memory_bytes for _, spec in specs),
    )


def summarize_strategy(strategy: Strategy, graph: ModelGraph) -> StrategySummary:
    """Shares of bytes per synchronizer kind; variables the strategy does not name count as nothing."""
    variables = {v.name: v for v in graph.variables if v.trainable}
    by_kind = {"ps": 0.0, "allreduce": 0.0, "sharded": 0.0}
    compressed = local = 0.0
    server_bytes: dict[str, float] = {}
    groups: set[tuple[str, int]] = set()
    num_shards = num_partitioned = 0
    for config in strategy.variables:
        var = variables.get(config.var_name)
        if var is None:
            continue
        num_partitioned += config.partition is not None
        for sync, numel in zip(config.synchronizers, shard_numel(var.shape, config.partition), strict=True):
            nbytes = float(numel * var.dtype.itemsize)
            num_shards += 1
            by_kind[sync.kind] += nbytes
            if isinstance(sync, PSSynchronizer):
                server_bytes[sync.reduction_destination] = server_bytes.get(sync.reduction_destination, 0.0) + nbytes
                local += nbytes if sync.local_replication else 0.0
            else:
                groups.add((sync.kind, sync.group))
                if sync.kind == "allreduce" and sync.compressor.kind != "none":
                    compressed += nbytes
    total = sum(by_kind.values())
    mesh = strategy.effective_mesh
    return StrategySummary(
        ps_fraction=_share(by_kind["ps"], total),
        allreduce_fraction=_share(by_kind["allreduce"], total),
        sharded_fraction=_share(by_kind["sharded"], total),
        compressed_fraction=_share(compressed, by_kind["allreduce"]),
        local_replication_fraction=_share(local, by_kind["ps"]),
        num_shards=float(num_shards),
        num_partitioned=float(num_partitioned),
        num_groups=float(len(groups)),
        num_ps_servers=float(len(server_bytes)),
        max_server_share=_share(max(server_bytes.values(), default=0.0), by_kind["ps"]),
        consistency_code=float(CONSISTENCY_CODES[strategy.consistency.kind]),
        staleness=float(strategy.consistency.staleness),
        data_degree=float(mesh.data),
        tensor_degree=float(mesh.tensor),
        pipeline_degree=float(mesh.pipeline),
        micro_batches=float(strategy.pipeline.micro_batches if strategy.pipeline else 1),
    )


def _share(part: float, whole: float) -> float:
    return min(1.0, part / whole) if whole > 0 else 0.0
