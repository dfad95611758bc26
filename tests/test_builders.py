"""The pre-built builders follow AutoDist's rules exactly, and every output is a valid strategy."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from sample_documents import make_embedding_graph, make_t4_cluster

from stratagem.builders import (
    BUILDERS,
    PS,
    AllReduce,
    Builder,
    DataParallel,
    Parallax,
    PartitionedAR,
    PartitionedPS,
    PSLoadBalancing,
    RandomAxisPartitionAR,
    UnevenPartitionedPS,
    all_builders,
    ddp_buckets,
    ps_servers,
    smallest_divisor,
    smallest_non_divisor,
)
from stratagem.errors import InvalidResourceSpecError, InvalidStrategyError
from stratagem.ir import Compressor, Layer, ModelGraph, PSSynchronizer, ResourceSpec, Strategy, Variable

A, B, C = "10.0.0.1:CPU:0", "10.0.0.2:CPU:0", "10.0.0.3:CPU:0"


def graph_of(*variables: dict[str, Any]) -> ModelGraph:
    """One layer per variable, in order, so graph order is the order given."""
    layers = [
        Layer(name=f"l{i}", variables=[v["name"]], inputs=[f"l{i - 1}"] if i else []) for i, v in enumerate(variables)
    ]
    return ModelGraph(batch_size=1, layers=layers, variables=[Variable(**v) for v in variables])


def var(name: str, *shape: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "shape": list(shape), **extra}


def destinations(strategy: Strategy, name: str) -> list[str]:
    return [s.reduction_destination for s in strategy.config_of(name).synchronizers if isinstance(s, PSSynchronizer)]


def groups(strategy: Strategy, name: str) -> list[int]:
    return [s.group for s in strategy.config_of(name).synchronizers]  # type: ignore[union-attr]


# --- every builder ------------------------------------------------------------------------------


@pytest.mark.parametrize("builder", all_builders(), ids=lambda b: b.name)
def test_every_builder_gives_a_valid_data_parallel_strategy(
    builder: Builder, any_graph: ModelGraph, any_cluster: ResourceSpec
) -> None:
    strategy = builder.build(any_graph, any_cluster)
    strategy.validate_for(any_graph, any_cluster)
    assert strategy.replicas == any_cluster.compute_devices
    assert (strategy.graph_id, strategy.resources_id) == (any_graph.id, any_cluster.id)
    assert strategy.provenance.builder == type(builder).__name__
    assert strategy.provenance.notes == [repr(builder)]
    assert [c.var_name for c in strategy.variables] == [v.name for v in any_graph.trainable_variables]
    assert builder.build(any_graph, any_cluster).id == strategy.id  # deterministic


def test_the_registry_lists_every_builder_by_class_name() -> None:
    assert list(BUILDERS) == [
        "PS",
        "PSLoadBalancing",
        "PartitionedPS",
        "UnevenPartitionedPS",
        "AllReduce",
        "PartitionedAR",
        "RandomAxisPartitionAR",
        "Parallax",
        "DataParallel",
    ]
    assert [type(b) for b in all_builders()] == list(BUILDERS.values())
    assert all(BUILDERS[name]().name == name for name in BUILDERS)


def test_builders_are_value_objects_with_autodists_arguments() -> None:
    assert PSLoadBalancing(sync=False) == PSLoadBalancing(False, False)  # positional, as in AutoDist
    assert (
        repr(AllReduce(chunk_size=4)) == "AllReduce(chunk_size=4, all_reduce_spec='NCCL', compressor='NoneCompressor')"
    )
    with pytest.raises(AttributeError):
        AllReduce().chunk_size = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: PS(sync=False, staleness=2), "PS.staleness: is 2 but sync is False"),
        (lambda: PartitionedPS(staleness=-1), "PartitionedPS.staleness: must be >= 0, got -1"),
        (lambda: Parallax(sync=False, staleness=1), "Parallax.staleness: is 1 but sync is False"),
        (lambda: AllReduce(chunk_size=0), "AllReduce.chunk_size: must be at least 1, got 0"),
        (lambda: Parallax(chunk_size=0), "Parallax.chunk_size: must be at least 1, got 0"),
        (
            lambda: AllReduce(all_reduce_spec="MPI"),
            "AllReduce.all_reduce_spec: 'MPI' is not one of ['AUTO', 'NCCL', 'RING']",
        ),
        (lambda: PartitionedAR(compressor="Zip"), "PartitionedAR.compressor: 'Zip' is not one of"),
        (lambda: DataParallel(bucket_cap_mb=0), "DataParallel.bucket_cap_mb: must be positive, got 0"),
        (lambda: DataParallel(algorithm="tree"), "DataParallel.algorithm: must be 'auto' or 'ring', got 'tree'"),
    ],
)
def test_bad_builder_arguments_are_refused_by_name(make: Any, expected: str) -> None:
    with pytest.raises(InvalidStrategyError) as caught:
        make()
    assert expected in str(caught.value)


@pytest.mark.parametrize(
    ("builder", "kind", "staleness"),
    [
        (PS(), "bsp", 0),
        (PSLoadBalancing(sync=False), "asp", 0),
        (PartitionedPS(staleness=3), "ssp", 3),
        (UnevenPartitionedPS(staleness=1), "ssp", 1),
        (Parallax(sync=False), "asp", 0),
        (Parallax(staleness=2), "ssp", 2),
    ],
)
def test_sync_and_staleness_become_the_consistency_model(
    builder: Builder, kind: str, staleness: int, embedding_graph: ModelGraph, t4_2x4: ResourceSpec
) -> None:
    strategy = builder.build(embedding_graph, t4_2x4).validate_for(embedding_graph, t4_2x4)
    assert (strategy.consistency.kind, strategy.consistency.staleness) == (kind, staleness)
    ps = [s for c in strategy.variables for s in c.synchronizers if isinstance(s, PSSynchronizer)]
    assert ps and all(s.sync == (kind != "asp") and s.staleness == staleness for s in ps)


# --- parameter servers --------------------------------------------------------------------------


def test_servers_are_one_per_node_on_its_first_cpu(t4_16x4: ResourceSpec) -> None:
    assert ps_servers(t4_16x4) == [f"10.0.0.{i}:CPU:0" for i in range(1, 17)]
    spec = ResourceSpec.parse({"nodes": [{"address": "h", "cpus": [3, 1]}]})
    assert ps_servers(spec) == ["h:CPU:1"]


def test_a_node_without_a_cpu_cannot_host_a_server(embedding_graph: ModelGraph) -> None:
    spec = ResourceSpec.parse(
        {
            "nodes": [
                {"address": "10.0.0.1", "chief": True, "gpus": [0]},
                {"address": "10.0.0.2", "gpus": [0], "cpus": []},
            ]
        }
    )
    with pytest.raises(InvalidResourceSpecError, match=r"nodes\[1\]\.cpus: lists no CPU"):
        PS().build(embedding_graph, spec)
    AllReduce().build(embedding_graph, spec).validate_for(embedding_graph, spec)  # no server needed


def test_ps_puts_every_variable_on_the_first_nodes_cpu(
    mlp_graph: ModelGraph, t4_16x4: ResourceSpec, cpu_1x2: ResourceSpec
) -> None:
    strategy = PS(local_proxy_variable=True).build(mlp_graph, t4_16x4)
    assert {d for c in strategy.variables for d in destinations(strategy, c.var_name)} == {A}
    assert all(s.local_replication for c in strategy.variables for s in c.synchronizers)  # type: ignore[union-attr]
    assert destinations(PS().build(mlp_graph, cpu_1x2), "fc1.weight") == ["127.0.0.1:CPU:0"]


def test_ps_load_balancing_places_each_variable_greedily_in_graph_order() -> None:
    graph = graph_of(var("v0", 100), var("v1", 60), var("v2", 50), var("v3", 30), var("v4", 20), var("v5", 10))
    strategy = PSLoadBalancing().build(graph, make_t4_cluster(3))
    # bytes 400, 240, 200, 120, 80, 40 onto the least loaded; ties go to the server listed first
    assert [destinations(strategy, f"v{i}")[0] for i in range(6)] == [A, B, C, C, B, B]
    assert all(c.partition is None for c in strategy.variables)


def test_ps_load_balancing_uses_every_server_of_a_big_cluster(t4_16x4: ResourceSpec) -> None:
    graph = graph_of(*[var(f"v{i}", 10) for i in range(32)])
    strategy = PSLoadBalancing().build(graph, t4_16x4)
    used = [destinations(strategy, f"v{i}")[0] for i in range(32)]
    assert used == ps_servers(t4_16x4) * 2


@pytest.mark.parametrize(
    ("n", "divisor", "non_divisor"),
    [(1, 1, 1), (2, 2, 2), (3, 3, 2), (6, 2, 4), (7, 7, 2), (9, 3, 2), (12, 2, 5), (64, 2, 3), (60, 2, 7)],
)
def test_shard_counts_follow_autodists_divisor_rules(n: int, divisor: int, non_divisor: int) -> None:
    assert smallest_divisor(n) == divisor
    assert smallest_non_divisor(n) == non_divisor


def test_partitioned_ps_splits_axis0_by_its_smallest_divisor(awkward_graph: ModelGraph, t4_2x4: ResourceSpec) -> None:
    strategy = PartitionedPS().build(awkward_graph, t4_2x4)
    shards = {c.var_name: c.num_shards for c in strategy.variables}
    assert shards == {
        "prime7.weight": 7,
        "pow64.weight": 2,
        "six.weight": 2,
        "nine.weight": 3,
        "one.weight": 1,
        "scalar.weight": 1,
        "half.weight": 2,
    }
    assert all(c.partition is None or c.partition.axis == 0 for c in strategy.variables)


def test_partitioned_ps_places_shards_on_the_least_loaded_servers_round_robin() -> None:
    graph = graph_of(var("prime7", 7, 5), var("pow64", 64, 3), var("one", 1, 12), var("scalar"))
    strategy = PartitionedPS().build(graph, make_t4_cluster(2))
    # 7 shards on 2 servers wrap round; each shard adds bytes/shards to its server's load
    assert destinations(strategy, "prime7") == [A, B, A, B, A, B, A]  # loads A 80, B 60
    assert destinations(strategy, "pow64") == [B, A]  # B was lighter; loads A 464, B 444
    assert destinations(strategy, "one") == [B]  # unpartitioned (dim 0 is 1); B 492
    assert destinations(strategy, "scalar") == [A]
    config = strategy.config_of("prime7")
    assert config.shard_synchronizers is not None and config.synchronizer == config.shard_synchronizers[0]


def test_uneven_partitioned_ps_uses_the_smallest_non_divisor() -> None:
    graph = graph_of(var("prime7", 7, 5), var("pow64", 64, 3), var("one", 1, 12), var("scalar"))
    strategy = UnevenPartitionedPS().build(graph, make_t4_cluster(2))
    assert [strategy.config_of(n).num_shards for n in ("prime7", "pow64", "one", "scalar")] == [2, 3, 1, 1]
    assert destinations(strategy, "prime7") == [A, B]  # loads 70, 70
    assert destinations(strategy, "pow64") == [A, B, A]  # a tie keeps server order; A 582, B 326
    assert destinations(strategy, "one") == [B]
    assert destinations(strategy, "scalar") == [B]


def test_partitioning_happens_even_on_a_single_server(mlp_graph: ModelGraph, cpu_1x2: ResourceSpec) -> None:
    strategy = PartitionedPS().build(mlp_graph, cpu_1x2)
    config = strategy.config_of("fc1.weight")
    assert config.num_shards == 2 and config.shard_synchronizers is None  # both shards on the one server
    assert destinations(strategy, "fc1.weight") == ["127.0.0.1:CPU:0"] * 2


# --- all-reduce ---------------------------------------------------------------------------------


def test_allreduce_groups_are_index_over_chunk_size_among_trainable_variables() -> None:
    graph = graph_of(var("a", 2), var("b", 2), var("frozen", 2, trainable=False), var("c", 2), var("d", 2), var("e", 2))
    strategy = AllReduce(chunk_size=2).build(graph, make_t4_cluster(2))
    assert [groups(strategy, n)[0] for n in "abcde"] == [0, 0, 1, 1, 2]


def test_allreduce_default_chunks_are_128_variables() -> None:
    graph = graph_of(*[var(f"v{i}", 3) for i in range(300)])
    strategy = AllReduce().build(graph, make_t4_cluster(1))
    assert [groups(strategy, f"v{i}")[0] for i in (0, 127, 128, 255, 256, 299)] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize(("spec", "algorithm"), [("AUTO", "auto"), ("NCCL", "auto"), ("RING", "ring")])
def test_allreduce_specs_map_to_algorithms(
    spec: str, algorithm: str, mlp_graph: ModelGraph, t4_2x4: ResourceSpec
) -> None:
    strategy = AllReduce(all_reduce_spec=spec).build(mlp_graph, t4_2x4)
    assert {s.algorithm for c in strategy.variables for s in c.synchronizers} == {algorithm}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NoneCompressor", Compressor(kind="none")),
        ("HorovodCompressor", Compressor(kind="fp16", error_feedback=False)),
        ("HorovodCompressorEF", Compressor(kind="fp16", error_feedback=True)),
        ("PowerSGDCompressor", Compressor(kind="powersgd", rank=1, error_feedback=True)),
    ],
)
def test_allreduce_compressors_map_to_stratagems(
    name: str, expected: Compressor, mlp_graph: ModelGraph, t4_2x4: ResourceSpec
) -> None:
    strategy = AllReduce(compressor=name).build(mlp_graph, t4_2x4)
    assert all(s.compressor == expected for c in strategy.variables for s in c.synchronizers)  # type: ignore[union-attr]


def test_partitioned_ar_counts_shards_for_groups() -> None:
    graph = graph_of(var("prime7", 7, 5), var("pow64", 64, 3), var("one", 1, 12))
    strategy = PartitionedAR(chunk_size=4).build(graph, make_t4_cluster(2))
    assert groups(strategy, "prime7") == [0, 0, 0, 0, 1, 1, 1]
    assert groups(strategy, "pow64") == [1, 2]
    assert groups(strategy, "one") == [2]
    assert strategy.config_of("one").partition is None
    assert {s.algorithm for c in strategy.variables for s in c.synchronizers} == {"auto"}  # type: ignore[union-attr]


def test_partitioned_ar_keeps_one_synchronizer_when_shards_share_a_group(
    awkward_graph: ModelGraph, t4_2x4: ResourceSpec
) -> None:
    config = PartitionedAR().build(awkward_graph, t4_2x4).config_of("nine.weight")
    assert config.partition is not None and (config.partition.axis, config.partition.shards) == (0, 3)
    assert config.shard_synchronizers is None


def test_random_axis_partition_is_reproducible_and_picks_long_axes(
    awkward_graph: ModelGraph, t4_2x4: ResourceSpec
) -> None:
    assert (
        RandomAxisPartitionAR(seed=7).build(awkward_graph, t4_2x4).id
        == RandomAxisPartitionAR(seed=7).build(awkward_graph, t4_2x4).id
    )
    axes_seen = set()
    for seed in range(20):
        strategy = RandomAxisPartitionAR(seed=seed).build(awkward_graph, t4_2x4)
        for config in strategy.variables:
            shape = awkward_graph.variable(config.var_name).shape
            if config.partition is None:
                assert all(length == 1 for length in shape)
                continue
            length = shape[config.partition.axis]
            assert length > 1 and config.partition.shards == smallest_divisor(length)
        nine = strategy.config_of("nine.weight").partition
        assert nine is not None
        axes_seen.add(nine.axis)
        assert strategy.config_of("one.weight").partition.axis == 1  # type: ignore[union-attr]
    assert axes_seen == {0, 1, 2}


def test_random_axis_partition_splits_sparse_variables_along_rows(t4_2x4: ResourceSpec) -> None:
    graph = make_embedding_graph(rows=1000, dim=64)
    for seed in range(5):
        partition = RandomAxisPartitionAR(seed=seed).build(graph, t4_2x4).config_of("embedding.weight").partition
        assert partition is not None and (partition.axis, partition.shards) == (0, 2)


# --- Parallax -----------------------------------------------------------------------------------


def test_parallax_all_reduces_dense_and_load_balances_sparse(embedding_graph: ModelGraph, t4_2x4: ResourceSpec) -> None:
    strategy = Parallax(chunk_size=2, local_proxy_variable=True).build(embedding_graph, t4_2x4)
    table = strategy.config_of("embedding.weight").synchronizer
    assert isinstance(table, PSSynchronizer) and table.reduction_destination == A
    assert table.local_replication is False  # AutoDist never proxies Parallax's sparse variables
    # groups count every trainable variable, the sparse one (index 0) included
    assert [groups(strategy, n)[0] for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")] == [0, 1, 1, 2]
    assert {s.algorithm for n in ("fc1.weight", "fc2.bias") for s in strategy.config_of(n).synchronizers} == {"auto"}  # type: ignore[union-attr]


def test_parallax_balances_several_sparse_tables() -> None:
    graph = graph_of(
        var("t0", 1000, 1, sparse=True, lookups_per_step=4),
        var("dense", 8),
        var("t1", 600, 1, sparse=True, lookups_per_step=4),
        var("t2", 500, 1, sparse=True, lookups_per_step=4),
    )
    strategy = Parallax().build(graph, make_t4_cluster(2))
    assert [destinations(strategy, n)[0] for n in ("t0", "t1", "t2")] == [A, B, B]
    assert strategy.config_of("dense").synchronizer.kind == "allreduce"


# --- DataParallel (DDP) -------------------------------------------------------------------------


def torch_ddp_buckets(variables: list[Variable], first_cap: int, cap: int) -> list[set[str]]:
    """Ask torch's own bucketing (what DDP's reducer calls) about the same tensors, on the meta device."""
    dtypes = {"float32": torch.float32, "float16": torch.float16}
    tensors = [torch.empty(v.shape, dtype=dtypes[v.dtype.value], device="meta") for v in variables]
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [first_cap, cap], [v.sparse for v in variables])
    return [{variables[i].name for i in bucket} for bucket in buckets]


def test_ddp_buckets_match_torchs_bucket_assignment() -> None:
    graph = graph_of(
        var("a", 300_000),
        var("h", 10, dtype="float16"),
        var("b", 3_000_000),
        var("c", 5),
        var("d", 4_000_000),
        var("e", 2_000_000),
        var("f", 100),
        var("g", 1_500_000),
        var("t", 1000, 16, sparse=True, lookups_per_step=3),
        var("z", 7),
    )
    ready = graph.trainable_variables[::-1]
    mine = [
        {ready[i].name for i in bucket} for bucket in ddp_buckets(ready, first_cap_bytes=2**20, cap_bytes=25 * 2**20)
    ]
    theirs = torch_ddp_buckets(ready, 2**20, 25 * 2**20)
    assert sorted(map(sorted, mine)) == sorted(map(sorted, theirs))
    assert mine == [{"z", "g"}, {"t"}, {"f", "e", "d", "c", "b"}, {"h"}, {"a"}]


@pytest.mark.parametrize("cap_mb", [0.01, 1, 25])
def test_data_parallel_groups_are_ddp_buckets_in_ready_order(
    cap_mb: float, mlp_graph: ModelGraph, t4_2x4: ResourceSpec
) -> None:
    builder = DataParallel(bucket_cap_mb=cap_mb, first_bucket_mb=min(cap_mb, 1))
    strategy = builder.build(mlp_graph, t4_2x4)
    ready = mlp_graph.trainable_variables[::-1]
    expected = torch_ddp_buckets(ready, int(builder.first_bucket_mb * 2**20), int(cap_mb * 2**20))
    by_group: dict[int, set[str]] = {}
    for config in strategy.variables:
        by_group.setdefault(groups(strategy, config.var_name)[0], set()).add(config.var_name)
    assert [by_group[g] for g in sorted(by_group)] == expected
    assert "fc3.bias" in by_group[0]  # the last layer's gradient is ready first


def test_data_parallel_fills_a_big_model_into_25_mib_buckets(t4_2x4: ResourceSpec) -> None:
    graph = graph_of(*[var(f"w{i}", 1024, 1024) for i in range(20)])  # 4 MiB each
    strategy = DataParallel().build(graph, t4_2x4)
    sizes: dict[int, int] = {}
    for i in range(20):
        group = groups(strategy, f"w{i}")[0]
        sizes[group] = sizes.get(group, 0) + 1
    # the first bucket closes after one 4 MiB tensor (cap 1 MiB), then 7 tensors reach 28 >= 25 MiB
    assert sizes == {0: 1, 1: 7, 2: 7, 3: 5}
    assert groups(strategy, "w19") == [0]


def test_built_strategies_share_no_mutable_parts(mlp_graph: ModelGraph, t4_2x4: ResourceSpec) -> None:
    """Editing one variable's synchronizer in place must not change another, nor the next build."""
    strategy = AllReduce(compressor="HorovodCompressor").build(mlp_graph, t4_2x4)
    strategy.variables[0].synchronizer.compressor.kind = "bf16"  # type: ignore[union-attr]
    assert strategy.variables[1].synchronizer.compressor.kind == "fp16"  # type: ignore[union-attr]
    assert (
        AllReduce(compressor="HorovodCompressor").build(mlp_graph, t4_2x4).variables[0].synchronizer.compressor.kind
        == "fp16"
    )  # type: ignore[union-attr]
    prime = PartitionedPS().build(graph_of(var("p", 7)), t4_2x4).config_of("p")
    assert prime.shard_synchronizers is not None and prime.synchronizer is not prime.shard_synchronizers[0]
