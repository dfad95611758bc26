"""Strategy's rules on its own and against the graph and cluster it is meant for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stratagem.errors import InvalidStrategyError
from stratagem.ir import (
    Compressor,
    Mesh,
    ModelGraph,
    Partition,
    PredictedPerformance,
    ResourceSpec,
    Strategy,
    shard_numel,
    shard_sizes,
)

GPUS = ["10.0.0.1:GPU:0", "10.0.0.1:GPU:1", "10.0.0.2:GPU:0", "10.0.0.2:GPU:1"]


def strategy_dict(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "replicas": list(GPUS),
        "variables": [
            {"var_name": "a", "synchronizer": {"kind": "allreduce", "algorithm": "ring", "group": 0}},
            {
                "var_name": "b",
                "synchronizer": {"kind": "ps", "reduction_destination": "10.0.0.1:CPU:0"},
                "partition": {"axis": 0, "shards": 2},
            },
        ],
    }
    data.update(overrides)
    return data


def error_text(data: dict[str, Any]) -> str:
    with pytest.raises(InvalidStrategyError) as caught:
        Strategy.parse(data)
    return str(caught.value)


def small_graph() -> ModelGraph:
    return ModelGraph.parse(
        {
            "batch_size": 2,
            "layers": [{"name": "l1", "variables": ["a", "b"]}, {"name": "l2", "inputs": ["l1"], "variables": ["c"]}],
            "variables": [
                {"name": "a", "shape": [6, 4]},
                {"name": "b", "shape": [3]},
                {"name": "c", "shape": [2, 2], "trainable": False},
            ],
        }
    )


def two_nodes() -> ResourceSpec:
    return ResourceSpec.parse(
        {
            "nodes": [
                {"address": "10.0.0.1", "chief": True, "gpus": [0, 1]},
                {"address": "10.0.0.2", "gpus": [0, 1]},
            ]
        }
    )


def validation_text(strategy: Strategy, graph: ModelGraph | None = None, resources: ResourceSpec | None = None) -> str:
    with pytest.raises(InvalidStrategyError) as caught:
        strategy.validate_for(graph or small_graph(), resources or two_nodes())
    return str(caught.value)


def test_a_valid_strategy_defaults_to_pure_data_parallel_bsp() -> None:
    strategy = Strategy.parse(strategy_dict())
    assert strategy.effective_mesh == Mesh(data=4)
    assert strategy.consistency.kind == "bsp"
    assert strategy.config_of("b").num_shards == 2
    assert [s.kind for s in strategy.config_of("b").synchronizers] == ["ps", "ps"]
    assert strategy.describe() == "4 replicas, data(4)*tensor(1)*pipeline(1)=4, bsp, 1 allreduce, 2 ps"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(owner="me"), "owner: Extra inputs are not permitted"),
        (lambda d: d["variables"][0].update(priority=1), "variables[0].priority: Extra inputs"),
        (lambda d: d["variables"][1]["synchronizer"].update(port=1), "variables[1].synchronizer.ps.port: Extra inputs"),
        (lambda d: d["variables"][1]["partition"].update(even=True), "variables[1].partition.even: Extra inputs"),
        (lambda d: d.update(mesh={"data": 4, "expert": 1}), "mesh.expert: Extra inputs"),
        (lambda d: d.update(consistency={"kind": "bsp", "bound": 1}), "consistency.bound: Extra inputs"),
        (lambda d: d.update(provenance={"author": "x"}), "provenance.author: Extra inputs"),
    ],
    ids=["top-level", "variable", "synchronizer", "partition", "mesh", "consistency", "provenance"],
)
def test_unknown_fields_are_rejected_at_every_level(mutate: Any, expected: str) -> None:
    data = strategy_dict()
    mutate(data)
    assert expected in error_text(data)


def test_unknown_synchronizer_kind_and_schema_version_are_refused() -> None:
    data = strategy_dict()
    data["variables"][0]["synchronizer"]["kind"] = "gossip"
    assert "variables[0].synchronizer: Input tag 'gossip' found using 'kind' does not match" in error_text(data)
    assert "schema_version: '0' is not supported" in error_text(strategy_dict(schema_version="0"))


def test_content_id_excludes_annotations_but_covers_what_executes() -> None:
    strategy = Strategy.parse(strategy_dict())
    annotated = strategy_dict(
        predicted={"step_time_s": 0.1, "samples_per_s": 320, "memory_per_device_bytes": 1e9, "bottleneck": "network"},
        measured={"step_time_s": 0.12, "samples_per_s": 300},
        provenance={"builder": "PS", "notes": ["hand-written"]},
    )
    assert Strategy.parse(annotated).id == strategy.id
    strategy.predicted = PredictedPerformance(step_time_s=1, samples_per_s=1, memory_per_device_bytes=1)
    assert strategy.id == Strategy.parse(strategy_dict()).id
    assert (
        Strategy.parse(strategy_dict(consistency={"kind": "ssp", "staleness": 2}, variables=[])).id
        != Strategy.parse(strategy_dict(variables=[])).id
    )
    assert Strategy.parse(strategy.to_json()).id == strategy.id
    assert "does not match the content" in error_text(strategy_dict(id="ab" * 32))


def test_replicas_must_be_device_names_listed_once() -> None:
    text = error_text(strategy_dict(replicas=["10.0.0.1:GPU:0", "10.0.0.1:gpu:1"]))
    assert "replicas[1]: '10.0.0.1:gpu:1' is not a device name" in text
    assert "replicas: a device is listed twice" in error_text(strategy_dict(replicas=GPUS[:1] * 2, mesh={"data": 2}))
    assert "replicas: List should have at least 1 item" in error_text(strategy_dict(replicas=[]))


def test_mesh_degrees_must_multiply_to_the_replica_count_showing_the_arithmetic() -> None:
    text = error_text(strategy_dict(mesh={"data": 2, "tensor": 4}))
    assert "mesh: data(2)*tensor(4)*pipeline(1)=8 != replicas(4)" in text
    ok = Strategy.parse(strategy_dict(mesh={"data": 2, "tensor": 2}))
    assert ok.effective_mesh.size == 4
    assert "mesh.data: Input should be greater than or equal to 1" in error_text(strategy_dict(mesh={"data": 0}))


def test_pipeline_degree_needs_matching_stages() -> None:
    assert "pipeline: mesh.pipeline is 2 but no pipeline stages are given" in error_text(
        strategy_dict(mesh={"data": 2, "pipeline": 2})
    )
    assert "pipeline.stages: 1 stages for mesh.pipeline(2)*virtual_stages(1)=2" in error_text(
        strategy_dict(mesh={"data": 2, "pipeline": 2}, pipeline={"stages": [["l1", "l2"]]})
    )


def test_interleaving_needs_virtual_stages_and_only_it_takes_them() -> None:
    two = {"data": 2, "pipeline": 2}
    assert "interleaved-1f1b needs at least 2 chunks per rank" in error_text(
        strategy_dict(mesh=two, pipeline={"stages": [["l1"], ["l2"]], "schedule": "interleaved-1f1b"})
    )
    assert "1f1b runs one chunk per rank, not 2" in error_text(
        strategy_dict(mesh=two, pipeline={"stages": [["l1"], ["l2"]], "virtual_stages": 2})
    )


def test_sequence_parallel_needs_a_tensor_group_and_shard_groups_divide_the_data_degree() -> None:
    assert "sequence_parallel: needs tensor parallelism (mesh.tensor > 1)" in error_text(
        strategy_dict(sequence_parallel=True)
    )
    sharded = {"kind": "sharded", "stage": 3, "shard_group": 3}
    text = error_text(strategy_dict(variables=[{"var_name": "a", "synchronizer": sharded}]))
    assert "shard_group(3) does not divide mesh.data(4)" in text


def test_pipeline_stages_must_cover_the_graphs_layers_in_order() -> None:
    base = {
        "mesh": {"data": 2, "pipeline": 2},
        "variables": [
            {"var_name": "a", "synchronizer": {"kind": "allreduce"}},
            {"var_name": "b", "synchronizer": {"kind": "allreduce"}},
        ],
    }
    good = Strategy.parse(strategy_dict(**base, pipeline={"stages": [["l1"], ["l2"]], "micro_batches": 4}))
    good.validate_for(small_graph(), two_nodes())
    backwards = Strategy.parse(strategy_dict(**base, pipeline={"stages": [["l2"], ["l1"]]}))
    assert "pipeline.stages: stages must cover every layer exactly once, in graph order" in validation_text(backwards)
    unknown = Strategy.parse(strategy_dict(**base, pipeline={"stages": [["l1"], ["l9"]]}))
    assert "pipeline.stages: unknown layer(s) ['l9']" in validation_text(unknown)


def test_a_variable_is_configured_only_once() -> None:
    data = strategy_dict()
    data["variables"].append({"var_name": "a", "synchronizer": {"kind": "sharded"}})
    assert "variables[2].var_name: 'a' is configured twice (also variables[0])" in error_text(data)


@pytest.mark.parametrize(
    ("consistency", "ps", "expected"),
    [
        (
            {"kind": "bsp"},
            {"sync": False},
            "variables[1].synchronizer: sync=False, staleness=0 contradicts bsp consistency",
        ),
        (
            {"kind": "ssp", "staleness": 3},
            {"staleness": 2},
            "sync=True, staleness=2 contradicts ssp consistency (expects sync=True, staleness=3)",
        ),
        ({"kind": "asp"}, {"sync": True}, "variables[1].synchronizer.sync: must be false under asp consistency"),
        ({"kind": "bsp"}, {"staleness": 1}, "contradicts bsp consistency (expects sync=True, staleness=0)"),
    ],
)
def test_ps_sync_flags_must_agree_with_the_consistency_model(
    consistency: dict[str, Any], ps: dict[str, Any], expected: str
) -> None:
    data = strategy_dict(consistency=consistency)
    data["variables"][1]["synchronizer"].update(ps)
    assert expected in error_text(data)


def test_consistency_models_check_their_staleness() -> None:
    assert "consistency: staleness: ssp needs a staleness bound of at least 1" in error_text(
        strategy_dict(consistency={"kind": "ssp"}, variables=[])
    )
    assert "consistency: staleness: bsp has no staleness" in error_text(
        strategy_dict(consistency={"kind": "bsp", "staleness": 2}, variables=[])
    )
    data = strategy_dict(consistency={"kind": "ssp", "staleness": 2})
    data["variables"][1]["synchronizer"]["staleness"] = 2
    assert Strategy.parse(data).consistency.staleness == 2


@pytest.mark.parametrize(
    ("compressor", "expected"),
    [
        ({"kind": "powersgd"}, "rank: required for the powersgd compressor"),
        ({"kind": "topk"}, "ratio: required for the topk compressor"),
        ({"kind": "fp16", "rank": 2}, "rank: only the powersgd compressor takes a rank, not fp16"),
        ({"kind": "none", "ratio": 0.1}, "ratio: only the topk compressor takes a ratio, not none"),
        ({"kind": "topk", "ratio": 1.5}, "ratio: Input should be less than or equal to 1"),
        ({"kind": "powersgd", "rank": 0}, "rank: Input should be greater than or equal to 1"),
        ({"kind": "zip"}, "kind: Input should be"),
    ],
)
def test_compressor_parameters_belong_to_their_compressor(compressor: dict[str, Any], expected: str) -> None:
    data = strategy_dict()
    data["variables"][0]["synchronizer"]["compressor"] = compressor
    text = error_text(data)
    assert "variables[0].synchronizer.allreduce.compressor" in text and expected in text


def test_valid_compressors_parse() -> None:
    assert Compressor(kind="powersgd", rank=4).rank == 4
    assert Compressor(kind="topk", ratio=0.01, error_feedback=False).ratio == 0.01


def test_shard_overrides_need_a_partition_with_as_many_shards() -> None:
    data = strategy_dict()
    data["variables"][0]["shard_synchronizers"] = [{"kind": "allreduce"}]
    assert "variables[0]: shard_synchronizers: given but the variable is not partitioned" in error_text(data)
    data = strategy_dict()
    data["variables"][1]["shard_synchronizers"] = [{"kind": "ps", "reduction_destination": "10.0.0.1:CPU:0"}]
    assert "variables[1]: shard_synchronizers: 1 given for 2 shards" in error_text(data)
    data["variables"][1]["shard_synchronizers"].append({"kind": "ps", "reduction_destination": "bad-device"})
    assert "variables[1].shard_synchronizers[1].reduction_destination: 'bad-device' is not a device name" in error_text(
        data
    )


def test_validate_for_accepts_a_strategy_that_fits() -> None:
    strategy = Strategy.parse(strategy_dict())
    graph, resources = small_graph(), two_nodes()
    assert strategy.validate_for(graph, resources) is strategy
    bound = Strategy.parse(strategy_dict(graph_id=graph.id, resources_id=resources.id))
    bound.validate_for(graph, resources)


def test_a_strategy_names_only_the_graphs_variables() -> None:
    data = strategy_dict()
    data["variables"].append({"var_name": "zeta", "synchronizer": {"kind": "allreduce"}})
    text = validation_text(Strategy.parse(data))
    assert "variables[2].var_name: 'zeta' is not a variable of the graph" in text


def test_a_strategy_covers_each_trainable_variable_and_only_those() -> None:
    data = strategy_dict()
    data["variables"].pop(1)
    assert "variables: no synchronizer for trainable variable(s) 'b'" in validation_text(Strategy.parse(data))
    data = strategy_dict()
    data["variables"].append({"var_name": "c", "synchronizer": {"kind": "allreduce"}})
    assert "variables[2].var_name: 'c' is not trainable and needs no synchronizer" in validation_text(
        Strategy.parse(data)
    )


def test_a_strategy_names_only_devices_of_its_resource_spec() -> None:
    data = strategy_dict(replicas=[*GPUS[:3], "10.0.0.3:GPU:0"])
    data["variables"][1]["synchronizer"]["reduction_destination"] = "10.0.0.9:CPU:0"
    text = validation_text(Strategy.parse(data))
    assert "replicas[3]: device '10.0.0.3:GPU:0' is not in the resource spec" in text
    assert "variables[1].synchronizer: reduction destination '10.0.0.9:CPU:0' is not in the resource spec" in text


def test_partitions_split_a_real_axis_into_at_most_its_length() -> None:
    data = strategy_dict()
    data["variables"][1]["partition"] = {"axis": 1, "shards": 2}
    assert "variables[1].partition.axis: axis 1 does not exist: b has shape [3]" in validation_text(
        Strategy.parse(data)
    )
    data["variables"][1]["partition"] = {"axis": 0, "shards": 4}
    assert "variables[1].partition.shards: 4 shards exceed axis 0 of length 3" in validation_text(Strategy.parse(data))
    data["variables"][1]["partition"] = {"axis": 0, "shards": 3}
    Strategy.parse(data).validate_for(small_graph(), two_nodes())


def test_a_strategy_made_for_another_graph_or_cluster_is_refused() -> None:
    strategy = Strategy.parse(strategy_dict(graph_id="a" * 64, resources_id="b" * 64))
    text = validation_text(strategy)
    assert "graph_id: made for graph aaaaaaaaaaaa, not " in text
    assert "resources_id: made for resource spec bbbbbbbbbbbb, not " in text


def test_shards_split_near_evenly_with_the_first_ones_larger() -> None:
    assert shard_sizes(7, 3) == [3, 2, 2]
    assert shard_sizes(64, 2) == [32, 32]
    assert sum(shard_sizes(1000, 7)) == 1000
    assert shard_numel([7, 5], Partition(axis=0, shards=3)) == [15, 10, 10]
    assert shard_numel([4, 6], Partition(axis=1, shards=4)) == [8, 8, 4, 4]
    assert shard_numel([4, 6], None) == [24]


def test_loading_a_file_that_is_not_utf8_is_the_documents_own_error(tmp_path: Path) -> None:
    garbled = tmp_path / "strategy.json"
    garbled.write_bytes(b"\xff\xfe{}")
    with pytest.raises(InvalidStrategyError, match="Invalid JSON"):
        Strategy.load(garbled)


def test_synchronizers_at_their_defaults_keep_their_kind_in_the_content_id(mlp_graph, t4_2x4):
    from stratagem.builders import AllReduce

    graph = mlp_graph
    allreduce = AllReduce().build(graph, t4_2x4)
    sharded = allreduce.replace(
        variables=[{"var_name": v.name, "synchronizer": {"kind": "sharded"}} for v in graph.trainable_variables]
    )
    assert allreduce.id != sharded.id
    assert allreduce.id_content()["variables"][0]["synchronizer"] == {"kind": "allreduce"}
