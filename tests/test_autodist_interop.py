"""Strategies survive the trip to AutoDist's strategy text and back; what AutoDist cannot say is refused."""

from __future__ import annotations

from typing import Any

import pytest

from stratagem.builders import PS, AllReduce, Builder, PartitionedPS, PSLoadBalancing, all_builders
from stratagem.errors import InvalidStrategyError, UnsupportedStrategyError
from stratagem.interop import strategy_from_autodist, strategy_to_autodist, unsupported_reasons
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

VARIANTS: list[Builder] = [
    *all_builders(),
    PSLoadBalancing(sync=False),
    PartitionedPS(staleness=3, local_proxy_variable=True),
    AllReduce(chunk_size=2, all_reduce_spec="RING", compressor="HorovodCompressor"),
    AllReduce(compressor="HorovodCompressorEF"),
    AllReduce(compressor="PowerSGDCompressor"),
]

SMALL = """\
id: "20200512T101010M123456"
node_config {
  var_name: "dense/kernel:0"
  AllReduceSynchronizer {
    spec: RING
    compressor: HorovodCompressorEF
    group: 1
  }
}
node_config {
  var_name: "emb/embeddings:0"
  partitioner: "2,1"
  part_config {
    var_name: "emb/embeddings/part_0:0"
    PSSynchronizer {
      reduction_destination: "10.0.0.1:CPU:0"
      sync: true
    }
  }
  part_config {
    var_name: "emb/embeddings/part_1:0"
    PSSynchronizer {
      reduction_destination: "10.0.0.2:CPU:0"
      sync: true
    }
  }
}
graph_config {
  replicas: "10.0.0.1:GPU:0"
  replicas: "10.0.0.2:GPU:0"
}
"""


def base_strategy(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "replicas": ["10.0.0.1:GPU:0", "10.0.0.2:GPU:0"],
        "variables": [
            {"var_name": "w", "synchronizer": {"kind": "allreduce"}},
            {"var_name": "e", "synchronizer": {"kind": "ps", "reduction_destination": "10.0.0.1:CPU:0"}},
        ],
    }
    data.update(changes)
    return data


def import_error(text: str, error: type[Exception] = InvalidStrategyError) -> str:
    with pytest.raises(error) as caught:
        strategy_from_autodist(text)
    return str(caught.value)


def export_error(data: dict[str, Any]) -> str:
    with pytest.raises(UnsupportedStrategyError) as caught:
        strategy_to_autodist(Strategy.parse(data))
    return str(caught.value)


# --- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("builder", VARIANTS, ids=repr)
def test_every_builders_output_survives_the_round_trip_unchanged(
    builder: Builder, any_graph: ModelGraph, any_cluster: ResourceSpec
) -> None:
    strategy = builder.build(any_graph, any_cluster)
    for options in ({}, {"graph": any_graph}, {"tf_names": False}):
        text = strategy.to_autodist(**options)
        back = Strategy.from_autodist(text, graph_id=strategy.graph_id, resources_id=strategy.resources_id)
        assert back.id == strategy.id
        assert back.model_dump(exclude={"provenance"}) == strategy.model_dump(exclude={"provenance"})
        back.validate_for(any_graph, any_cluster)


def test_autodist_text_survives_the_round_trip_unchanged() -> None:
    """Byte for byte, given the graph: the text names only the split axis's count, the graph the rank."""
    graph = ModelGraph.parse(
        {
            "batch_size": 1,
            "layers": [{"name": "l", "variables": ["dense/kernel", "emb/embeddings"]}],
            "variables": [{"name": "dense/kernel", "shape": [8, 4]}, {"name": "emb/embeddings", "shape": [10, 4]}],
        }
    )
    strategy = strategy_from_autodist(SMALL)
    assert strategy_to_autodist(strategy, graph=graph).replace(str(strategy.id), "20200512T101010M123456") == SMALL
    assert strategy.provenance.notes == ["imported from AutoDist strategy '20200512T101010M123456'"]


def test_import_strips_tensorflows_output_suffix_and_reads_every_setting() -> None:
    strategy = strategy_from_autodist(SMALL, graph_id="g" * 64, resources_id="r" * 64)
    assert [c.var_name for c in strategy.variables] == ["dense/kernel", "emb/embeddings"]
    assert (strategy.graph_id, strategy.resources_id) == ("g" * 64, "r" * 64)
    dense = strategy.config_of("dense/kernel").synchronizer
    assert dense.kind == "allreduce" and dense.algorithm == "ring" and dense.group == 1  # type: ignore[union-attr]
    assert (dense.compressor.kind, dense.compressor.error_feedback) == ("fp16", True)  # type: ignore[union-attr]
    emb = strategy.config_of("emb/embeddings")
    assert emb.partition is not None and (emb.partition.axis, emb.partition.shards) == (0, 2)
    assert [s.reduction_destination for s in emb.synchronizers] == ["10.0.0.1:CPU:0", "10.0.0.2:CPU:0"]  # type: ignore[union-attr]
    assert strategy.replicas == ["10.0.0.1:GPU:0", "10.0.0.2:GPU:0"] and strategy.consistency.kind == "bsp"


def test_export_writes_what_autodists_builders_write(mlp_graph: ModelGraph, t4_2x4: ResourceSpec) -> None:
    text = PartitionedPS().build(mlp_graph, t4_2x4).to_autodist(graph=mlp_graph)
    assert (
        'var_name: "fc1.weight:0"\n  partitioner: "2,1"\n  part_config {\n    var_name: "fc1.weight/part_0:0"' in text
    )
    assert 'partitioner: "2"\n' in PartitionedPS().build(mlp_graph, t4_2x4).to_autodist(
        graph=mlp_graph
    )  # a bias is 1-d
    assert 'partitioner: "2"\n' in PartitionedPS().build(mlp_graph, t4_2x4).to_autodist()  # no graph: up to the axis
    ring = AllReduce(all_reduce_spec="RING", chunk_size=1).build(mlp_graph, t4_2x4).to_autodist(tf_names=False)
    assert 'var_name: "fc1.bias"\n  AllReduceSynchronizer {\n    spec: RING\n    group: 1\n  }' in ring
    plain = AllReduce(all_reduce_spec="AUTO").build(mlp_graph, t4_2x4).to_autodist()
    assert "AllReduceSynchronizer {\n  }" in plain  # proto3 leaves defaults out


def test_export_with_a_graph_refuses_variables_it_does_not_have(
    mlp_graph: ModelGraph, embedding_graph: ModelGraph, t4_2x4: ResourceSpec
) -> None:
    strategy = PartitionedPS().build(embedding_graph, t4_2x4)
    with pytest.raises(
        InvalidStrategyError, match=r"variables\[0\]\.var_name: 'embedding.weight' is not a variable of the graph"
    ):
        strategy.to_autodist(graph=mlp_graph)


def test_consistency_is_read_from_the_ps_flags() -> None:
    def ps_text(flags: str) -> str:
        return (
            f'node_config {{ var_name: "a:0" PSSynchronizer {{ reduction_destination: "h:CPU:0" {flags} }} }}\n'
            f'node_config {{ var_name: "b:0" PSSynchronizer {{ reduction_destination: "h:CPU:0" {flags} }} }}\n'
            'graph_config { replicas: "h:CPU:0" }'
        )

    assert strategy_from_autodist(ps_text("sync: true")).consistency.kind == "bsp"
    assert strategy_from_autodist(ps_text("")).consistency.kind == "asp"
    ssp = strategy_from_autodist(ps_text("sync: true staleness: 4")).consistency
    assert (ssp.kind, ssp.staleness) == ("ssp", 4)
    no_ps = 'node_config { var_name: "a" AllReduceSynchronizer {} } graph_config { replicas: "h:CPU:0" }'
    assert strategy_from_autodist(no_ps).consistency.kind == "bsp"


def test_ps_flags_that_disagree_are_refused_naming_the_variable() -> None:
    text = (
        'node_config { var_name: "a:0" PSSynchronizer { reduction_destination: "h:CPU:0" sync: true } }\n'
        'node_config { var_name: "b:0" PSSynchronizer { reduction_destination: "h:CPU:0" sync: true staleness: 2 } }\n'
        'graph_config { replicas: "h:CPU:0" }'
    )
    message = import_error(text, UnsupportedStrategyError)
    assert "'b': PSSynchronizer sync=True, staleness=2 differs from 'a' (sync=True, staleness=0)" in message


# --- the text format ----------------------------------------------------------------------------


def test_the_reader_accepts_the_whole_text_format() -> None:
    text = """
    # AutoDist strategy written by hand
    id: 'hand' "-made";
    node_config: <
      var_name: "w\\072\\x30"  # octal and hex escapes: w:0
      AllReduceSynchronizer: { spec: 2, compressor: 1, group: 0x3 }
    >
    node_config {
      var_name: "t"
      partitioner: "1,3"
      PSSynchronizer { reduction_destination: "h:CPU:0" sync: True }
    }
    graph_config { replicas: ["h:GPU:0", "h:GPU:1"] }
    """
    strategy = strategy_from_autodist(text)
    w = strategy.config_of("w").synchronizer
    assert (w.algorithm, w.group, w.compressor.kind, w.compressor.error_feedback) == ("ring", 3, "fp16", False)  # type: ignore[union-attr]
    t = strategy.config_of("t")
    assert t.partition is not None and (t.partition.axis, t.partition.shards) == (1, 3)
    assert t.shard_synchronizers is None and t.synchronizer.kind == "ps"  # no part_config: every shard shares it
    assert strategy.replicas == ["h:GPU:0", "h:GPU:1"]
    assert strategy.provenance.notes == ["imported from AutoDist strategy 'hand-made'"]


def test_non_ascii_names_are_escaped_like_protobuf_does() -> None:
    strategy = Strategy.parse(
        base_strategy(variables=[{"var_name": 'größe\n"x"', "synchronizer": {"kind": "allreduce"}}])
    )
    text = strategy_to_autodist(strategy)
    assert 'var_name: "gr\\303\\266\\303\\237e\\n\\"x\\":0"' in text
    assert strategy_from_autodist(text).id == strategy.id


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node_config { var_name: 'a' colour: 1 }", "node_config[0].colour: unknown field of AutoDist's Node message"),
        (
            'node_config { var_name: "a" PSSynchronizer { reduction_destination: "h:CPU:0" sync: 3 } }',
            "node_config[0].PSSynchronizer.sync: must be true or false, found 3",
        ),
        (
            "node_config { var_name: 'a' AllReduceSynchronizer { spec: MPI } }",
            "node_config[0].AllReduceSynchronizer.spec: must be one of AUTO, NCCL, RING, found 'MPI'",
        ),
        (
            "node_config { var_name: 'a' AllReduceSynchronizer { group: 1.5 } }",
            "group: must be a 32-bit integer, found 1.5",
        ),
        ("id: 'x' id: 'y'", "id: given twice, but it is not a repeated field (line 1)"),
        (
            "node_config { var_name: 'a' PSSynchronizer { } AllReduceSynchronizer { } }",
            "node_config[0]: sets both PSSynchronizer and AllReduceSynchronizer; a node has one synchronizer",
        ),
        (
            "node_config { var_name: 'a'\n AllReduceSynchronizer { }\n}\ngraph_config { replicas: 3 }",
            "graph_config.replicas[0]: must be a quoted string, found 3 (line 4)",
        ),
        ("graph_config: 'x'", "graph_config: is a GraphConfig message; write graph_config { ... }"),
        ("node_config {\n  var_name: 'a'\n  AllReduceSynchronizer {\n", "line 3, column 26: unexpected end of text"),
        ("node_config { var_name 'a' }", "expected ':' or '{' after 'var_name', found \"'a'\""),
        ("node_config { var_name: 'a' } @", "line 1, column 31: unexpected character '@'"),
        ("node_config { var_name: 'a\\q' }", "unknown escape '\\q' in a string"),
    ],
)
def test_malformed_text_is_refused_naming_the_field_and_line(text: str, expected: str) -> None:
    assert expected in import_error(text)


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ("var_name: ''", "node_config[0].var_name: is empty"),
        ("var_name: 'a'", "node_config[0]: has no synchronizer"),
        (
            "var_name: 'a' PSSynchronizer { sync: true }",
            "node_config[0].PSSynchronizer.reduction_destination: is empty",
        ),
        (
            "var_name: 'a' AllReduceSynchronizer { group: -1 }",
            "node_config[0].AllReduceSynchronizer.group: must be >= 0, got -1",
        ),
        (
            "var_name: 'a' partitioner: '2,2' AllReduceSynchronizer {}",
            "node_config[0].partitioner: '2,2' splits 2 axes; AutoDist partitions along one axis only",
        ),
        (
            "var_name: 'a' partitioner: '1,1' AllReduceSynchronizer {}",
            "node_config[0].partitioner: '1,1' splits nothing",
        ),
        (
            "var_name: 'a' partitioner: 'x' AllReduceSynchronizer {}",
            "'x' is not a comma-separated list of shard counts",
        ),
        ("var_name: 'a' partitioner: '0,2' AllReduceSynchronizer {}", "every axis needs at least 1 shard"),
        (
            "var_name: 'a' partitioner: '3' part_config { var_name: 'p' AllReduceSynchronizer {} }",
            "node_config[0].part_config: 1 parts for 3 shards ('3')",
        ),
        (
            "var_name: 'a' AllReduceSynchronizer {} part_config { var_name: 'p' AllReduceSynchronizer {} }",
            "node_config[0].part_config: given without a partitioner",
        ),
        ("var_name: 'a' partitioner: '1' part_config { var_name: 'p' partitioner: '2' }", "splits nothing"),
        (
            "var_name: 'a' partitioner: '2' part_config { var_name: 'p' AllReduceSynchronizer {} } part_config { var_name: 'q' }",
            "node_config[0].part_config[1]: has no synchronizer",
        ),
    ],
)
def test_nodes_that_make_no_sense_are_refused_naming_the_node(node: str, expected: str) -> None:
    assert expected in import_error(f"node_config {{ {node} }} graph_config {{ replicas: 'h:CPU:0' }}")


def test_a_strategy_without_replicas_or_with_bad_devices_is_refused() -> None:
    assert "graph_config.replicas: AutoDist strategy lists no replicas" in import_error(
        "node_config { var_name: 'a' AllReduceSynchronizer {} }"
    )
    text = "node_config { var_name: 'a' PSSynchronizer { reduction_destination: 'nowhere' sync: true } } graph_config { replicas: 'h:CPU:0' }"
    assert "variables[0].synchronizer.reduction_destination: 'nowhere' is not a device name" in import_error(text)


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ("var_name: 'a:0' SFBSynchronizer { }", "node_config[0] ('a'): AutoDist's SFBSynchronizer"),
        (
            "var_name: 'a' AllReduceSynchronizer {} compressor { type: SFBCompressor }",
            "node_config[0] ('a'): AutoDist's per-node SFBCompressor",
        ),
        (
            "var_name: 'a' partitioner: '2' part_config { var_name: 'p0' AllReduceSynchronizer {} } part_config { var_name: 'p1' SFBSynchronizer {} }",
            "node_config[0] ('a') shard 1: AutoDist's SFBSynchronizer",
        ),
    ],
)
def test_autodist_features_stratagem_lacks_are_unsupported(node: str, expected: str) -> None:
    message = import_error(f"node_config {{ {node} }} graph_config {{ replicas: 'h:CPU:0' }}", UnsupportedStrategyError)
    assert expected in message


# --- what AutoDist cannot express ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"kind": "sharded"}, "variables[0] ('w'): the sharded (ZeRO) synchronizer has no AutoDist equivalent"),
        (
            {"kind": "allreduce", "algorithm": "tree"},
            "variables[0] ('w'): all-reduce algorithm 'tree' has no AutoDist spec",
        ),
        ({"kind": "allreduce", "algorithm": "hierarchical"}, "algorithm 'hierarchical' has no AutoDist spec"),
        ({"kind": "allreduce", "compressor": {"kind": "bf16"}}, "variables[0] ('w'): AutoDist has no bf16 compressor"),
        ({"kind": "allreduce", "compressor": {"kind": "topk", "ratio": 0.01}}, "AutoDist has no topk compressor"),
        (
            {"kind": "allreduce", "compressor": {"kind": "powersgd", "rank": 4}},
            "PowerSGD rank 4: AutoDist's PowerSGDCompressor has a fixed rank of 1",
        ),
        (
            {"kind": "allreduce", "compressor": {"kind": "powersgd", "rank": 1, "error_feedback": False}},
            "PowerSGD without error feedback",
        ),
    ],
)
def test_synchronizers_autodist_lacks_are_refused_naming_the_variable(change: dict[str, Any], expected: str) -> None:
    data = base_strategy()
    data["variables"][0]["synchronizer"] = change
    assert expected in export_error(data)


def test_tensor_and_pipeline_parallelism_are_refused() -> None:
    data = base_strategy(replicas=["h:GPU:0", "h:GPU:1", "h:GPU:2", "h:GPU:3"], mesh={"data": 2, "tensor": 2})
    assert "mesh data(2)*tensor(2)*pipeline(1)=4: AutoDist runs data parallelism only" in export_error(data)
    data = base_strategy(mesh={"data": 1, "pipeline": 2}, pipeline={"stages": [["l1"], ["l2"]]})
    assert "pipeline(2)=2: AutoDist runs data parallelism only" in export_error(data)


def test_async_consistency_needs_a_ps_synchronizer_to_carry_it() -> None:
    data = base_strategy(consistency={"kind": "asp"})
    data["variables"].pop(1)
    assert "consistency asp: AutoDist carries it only in PS synchronizers' sync/staleness flags" in export_error(data)
    data = base_strategy(consistency={"kind": "ssp", "staleness": 2})
    data["variables"][1]["synchronizer"]["staleness"] = 2
    assert strategy_from_autodist(strategy_to_autodist(Strategy.parse(data))).consistency.staleness == 2


def test_every_reason_is_reported_at_once() -> None:
    data = base_strategy(consistency={"kind": "asp"})
    data["variables"] = [
        {"var_name": "w", "synchronizer": {"kind": "sharded"}},
        {"var_name": "v", "synchronizer": {"kind": "allreduce", "algorithm": "tree"}},
    ]
    reasons = unsupported_reasons(Strategy.parse(data))
    assert [r.split(":")[0] for r in reasons] == ["variables[0] ('w')", "variables[1] ('v')", "consistency asp"]
    assert unsupported_reasons(PS().build(*_tiny())) == []


def test_a_one_shard_partition_is_written_unpartitioned() -> None:
    data = base_strategy()
    data["variables"][1]["partition"] = {"axis": 0, "shards": 1}
    text = strategy_to_autodist(Strategy.parse(data))
    assert "partitioner" not in text
    assert strategy_from_autodist(text).config_of("e").partition is None


def _tiny() -> tuple[ModelGraph, ResourceSpec]:
    graph = ModelGraph.parse(
        {"batch_size": 1, "layers": [{"name": "l", "variables": ["w"]}], "variables": [{"name": "w", "shape": [2]}]}
    )
    return graph, ResourceSpec.parse({"nodes": [{"address": "h", "cpus": [0, 1]}]})


# --- against protobuf itself --------------------------------------------------------------------


def autodist_strategy_class() -> Any:
    """AutoDist's Strategy message built from its .proto definitions with protobuf's own descriptors."""
    descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
    from google.protobuf import descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    optional, repeated = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    sync = descriptor_pb2.FileDescriptorProto(
        name="autodist/proto/synchronizers.proto", package="autodist.proto", syntax="proto3"
    )
    ps = sync.message_type.add(name="PSSynchronizer")
    for number, (name, kind) in enumerate(
        [
            ("reduction_destination", field.TYPE_STRING),
            ("local_replication", field.TYPE_BOOL),
            ("sync", field.TYPE_BOOL),
            ("staleness", field.TYPE_INT32),
        ],
        start=1,
    ):
        ps.field.add(name=name, number=number, type=kind, label=optional)
    ar = sync.message_type.add(name="AllReduceSynchronizer")
    for enum_name, values in (
        ("Spec", ["AUTO", "NCCL", "RING"]),
        ("Compressor", ["NoneCompressor", "HorovodCompressor", "HorovodCompressorEF", "PowerSGDCompressor"]),
    ):
        enum = ar.enum_type.add(name=enum_name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    ar.field.add(
        name="spec",
        number=1,
        type=field.TYPE_ENUM,
        type_name=".autodist.proto.AllReduceSynchronizer.Spec",
        label=optional,
    )
    ar.field.add(
        name="compressor",
        number=2,
        type=field.TYPE_ENUM,
        type_name=".autodist.proto.AllReduceSynchronizer.Compressor",
        label=optional,
    )
    ar.field.add(name="group", number=3, type=field.TYPE_INT32, label=optional)

    strategy_file = descriptor_pb2.FileDescriptorProto(
        name="autodist/proto/strategy.proto", package="autodist.proto", syntax="proto3", dependency=[sync.name]
    )
    strategy = strategy_file.message_type.add(name="Strategy")
    node = strategy.nested_type.add(name="Node")
    node.oneof_decl.add(name="synchronizer")
    node.field.add(name="var_name", number=1, type=field.TYPE_STRING, label=optional)
    node.field.add(
        name="PSSynchronizer",
        number=2,
        type=field.TYPE_MESSAGE,
        type_name=".autodist.proto.PSSynchronizer",
        label=optional,
        oneof_index=0,
    )
    node.field.add(
        name="AllReduceSynchronizer",
        number=3,
        type=field.TYPE_MESSAGE,
        type_name=".autodist.proto.AllReduceSynchronizer",
        label=optional,
        oneof_index=0,
    )
    node.field.add(name="partitioner", number=5, type=field.TYPE_STRING, label=optional)
    node.field.add(
        name="part_config", number=6, type=field.TYPE_MESSAGE, type_name=".autodist.proto.Strategy.Node", label=repeated
    )
    graph_config = strategy.nested_type.add(name="GraphConfig")
    graph_config.field.add(name="replicas", number=1, type=field.TYPE_STRING, label=repeated)
    strategy.field.add(name="id", number=1, type=field.TYPE_STRING, label=optional)
    strategy.field.add(name="path", number=2, type=field.TYPE_STRING, label=optional)
    strategy.field.add(
        name="node_config", number=3, type=field.TYPE_MESSAGE, type_name=".autodist.proto.Strategy.Node", label=repeated
    )
    strategy.field.add(
        name="graph_config",
        number=4,
        type=field.TYPE_MESSAGE,
        type_name=".autodist.proto.Strategy.GraphConfig",
        label=optional,
    )

    pool = descriptor_pool.DescriptorPool()
    pool.Add(sync)
    pool.Add(strategy_file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("autodist.proto.Strategy"))


@pytest.mark.parametrize("builder", VARIANTS, ids=repr)
def test_our_text_is_exactly_what_protobuf_writes(
    builder: Builder, awkward_graph: ModelGraph, t4_2x4: ResourceSpec
) -> None:
    text_format = pytest.importorskip("google.protobuf.text_format")
    message_class = autodist_strategy_class()
    ours = builder.build(awkward_graph, t4_2x4).to_autodist(graph=awkward_graph)
    message = text_format.Parse(ours, message_class())
    assert text_format.MessageToString(message) == ours


def test_we_read_what_protobuf_writes_for_an_autodist_builder() -> None:
    """The message AutoDist's PartitionedPS builds for a TF variable, written by protobuf in both layouts."""
    text_format = pytest.importorskip("google.protobuf.text_format")
    message = autodist_strategy_class()()
    message.id = "20200101T000000M000000"
    node = message.node_config.add(var_name="dense/kernel:0", partitioner="3,1")
    for i, server in enumerate(["10.0.0.1:CPU:0", "10.0.0.2:CPU:0", "10.0.0.1:CPU:0"]):
        part = node.part_config.add(var_name=f"dense/kernel/part_{i}:0")
        part.PSSynchronizer.reduction_destination = server
        part.PSSynchronizer.sync = True
    bias = message.node_config.add(var_name="dense/bias:0")
    bias.AllReduceSynchronizer.spec = 1  # NCCL
    bias.AllReduceSynchronizer.group = 2
    message.graph_config.replicas.extend(["10.0.0.1:GPU:0", "10.0.0.2:GPU:0"])
    for one_line in (False, True):
        strategy = strategy_from_autodist(text_format.MessageToString(message, as_one_line=one_line))
        kernel = strategy.config_of("dense/kernel")
        assert kernel.partition is not None and kernel.partition.shards == 3
        assert [s.reduction_destination for s in kernel.synchronizers] == [
            "10.0.0.1:CPU:0",
            "10.0.0.2:CPU:0",
            "10.0.0.1:CPU:0",
        ]  # type: ignore[union-attr]
        assert strategy.config_of("dense/bias").synchronizer.group == 2  # type: ignore[union-attr]
