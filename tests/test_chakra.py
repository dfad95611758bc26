"""The Chakra export decodes with the protobuf runtime against Chakra's own schema, one node per traced op.

The schema is MLCommons Chakra's `schema/protobuf/et_def.proto` (github.com/mlcommons/chakra, package
`ChakraProtoMsg`), rebuilt here as a protobuf descriptor from its field names, numbers and types, so
the file is read by protobuf itself, not by the code that wrote it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from stratagem.cli import main as cli_main
from stratagem.tracing import capture
from stratagem.tracing.chakra import CHAKRA_VERSION, read_delimited, to_chakra

descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
from google.protobuf import descriptor_pool, message_factory  # noqa: E402
from google.protobuf.unknown_fields import UnknownFieldSet  # noqa: E402

F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "double": F.TYPE_DOUBLE,
    "float": F.TYPE_FLOAT,
    "int32": F.TYPE_INT32,
    "int64": F.TYPE_INT64,
    "uint32": F.TYPE_UINT32,
    "uint64": F.TYPE_UINT64,
    "sint32": F.TYPE_SINT32,
    "sint64": F.TYPE_SINT64,
    "fixed32": F.TYPE_FIXED32,
    "fixed64": F.TYPE_FIXED64,
    "sfixed32": F.TYPE_SFIXED32,
    "sfixed64": F.TYPE_SFIXED64,
    "bool": F.TYPE_BOOL,
    "string": F.TYPE_STRING,
    "bytes": F.TYPE_BYTES,
}
_LISTS = ["double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64"]
_LISTS += ["fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes"]


def _chakra_schema() -> dict[str, type]:
    """et_def.proto's messages (AttributeProto, the *List wrappers, GlobalMetadata, IOInfo, Node)."""
    file = descriptor_pb2.FileDescriptorProto(name="et_def.proto", package="ChakraProtoMsg", syntax="proto3")

    def message(name: str, fields: list[tuple[str, int, str, bool]], oneof: str | None = None) -> None:
        proto = file.message_type.add(name=name)
        if oneof:
            proto.oneof_decl.add(name=oneof)
        for field_name, number, kind, repeated in fields:
            field = proto.field.add(name=field_name, number=number)
            field.label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
            if kind in _SCALARS:
                field.type = _SCALARS[kind]
            elif kind == "NodeType":
                field.type, field.type_name = F.TYPE_ENUM, ".ChakraProtoMsg.NodeType"
            else:
                field.type, field.type_name = F.TYPE_MESSAGE, f".ChakraProtoMsg.{kind}"
            if oneof and number >= 3:
                field.oneof_index = 0

    value_fields = []
    for position, kind in enumerate(_LISTS):
        title = kind[0].upper() + kind[1:]
        message(f"{title}List", [("values", 1, kind, True)])
        value_fields += [(f"{kind}_val", 3 + 2 * position, kind, False)]
        value_fields += [(f"{kind}_list", 4 + 2 * position, f"{title}List", False)]
    message(
        "AttributeProto", [("name", 1, "string", False), ("doc_string", 2, "string", False), *value_fields], "value"
    )
    message("GlobalMetadata", [("version", 1, "string", False), ("attr", 2, "AttributeProto", True)])
    node_types = file.enum_type.add(name="NodeType")
    names = ["INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "COMP_NODE", "COMM_SEND_NODE"]
    names += ["COMM_RECV_NODE", "COMM_COLL_NODE", "STORAGE_NODE", "BATCH_NODE", "CHECKPOINT_NODE"]
    for number, name in enumerate(names):
        node_types.value.add(name=name, number=number)
    message("IOInfo", [("values", 1, "string", False), ("shapes", 2, "string", False), ("types", 3, "string", False)])
    message(
        "Node",
        [
            ("id", 1, "uint64", False),
            ("name", 2, "string", False),
            ("type", 3, "NodeType", False),
            ("ctrl_deps", 4, "uint64", True),
            ("data_deps", 5, "uint64", True),
            ("start_time_micros", 6, "uint64", False),
            ("duration_micros", 7, "uint64", False),
            ("inputs", 8, "IOInfo", False),
            ("outputs", 9, "IOInfo", False),
            ("attr", 10, "AttributeProto", True),
        ],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ChakraProtoMsg.{name}"))
        for name in ("GlobalMetadata", "Node")
    }


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _decode(data: bytes):
    schema = _chakra_schema()
    messages = read_delimited(data)
    metadata = schema["GlobalMetadata"].FromString(messages[0])
    nodes = [schema["Node"].FromString(m) for m in messages[1:]]
    for parsed in (metadata, *nodes):
        assert len(UnknownFieldSet(parsed)) == 0  # every field written is one the schema declares
    return metadata, nodes


def test_every_op_becomes_a_compute_node_with_its_dependencies_and_attributes() -> None:
    trace = capture(Net(), (torch.randn(2, 3, 8, 8),), batch_size=2).trace
    metadata, nodes = _decode(to_chakra(trace))
    assert metadata.version == CHAKRA_VERSION
    assert {a.name: a.string_val for a in metadata.attr if a.HasField("string_val")}["generator"] == "stratagem"
    assert len(nodes) == trace.num_ops and [n.id for n in nodes] == list(range(trace.num_ops))
    assert all(n.type == 4 for n in nodes)  # COMP_NODE
    ops = [*trace.forward, *trace.backward, *trace.optimizer_step]
    assert [n.name for n in nodes] == [op.op.removesuffix(".default") for op in ops]
    assert all(list(n.ctrl_deps) == ([n.id - 1] if n.id else []) for n in nodes)
    assert all(dep < n.id for n in nodes for dep in n.data_deps)
    conv = next(n for n in nodes if n.name == "aten::convolution")
    attrs = {a.name: a for a in conv.attr}
    assert attrs["num_ops"].int64_val == round(next(op.flops for op in ops if op.op == "aten::convolution.default"))
    assert attrs["tensor_size"].uint64_val > 0 and attrs["is_cpu_op"].bool_val is False
    assert attrs["layer"].string_val == "conv" and attrs["phase"].string_val == "forward"
    assert ast.literal_eval(conv.inputs.shapes)[:2] == [[2, 3, 8, 8], [4, 3, 3, 3]]
    assert ast.literal_eval(conv.outputs.types) == ["Tensor(float32)"]
    backward = [n for n in nodes if {a.name: a.string_val for a in n.attr}["phase"] == "backward"]
    assert backward and any(n.data_deps and min(n.data_deps) < len(trace.forward) for n in backward)


def test_the_cli_writes_the_chakra_file_and_the_trace_the_graph_names(tmp_path: Path) -> None:
    graph_path, trace_path, chakra_path = tmp_path / "g.json", tmp_path / "g.trace.json.gz", tmp_path / "g.et"
    code = cli_main(
        [
            "capture",
            "gpt",
            "--batch",
            "2",
            "-o",
            str(graph_path),
            "--trace",
            str(trace_path),
            "--chakra",
            str(chakra_path),
        ]
    )
    assert code == 0
    from stratagem.ir import ModelGraph
    from stratagem.tracing.optrace import OperatorTrace

    graph, trace = ModelGraph.load(graph_path), OperatorTrace.load(trace_path)
    assert graph.trace_id == trace.id
    _, nodes = _decode(chakra_path.read_bytes())
    assert len(nodes) == trace.num_ops
    plain = tmp_path / "plain.json"
    assert cli_main(["capture", "gpt", "--batch", "2", "-o", str(plain), "--chakra", str(tmp_path / "only.et")]) == 0
    assert ModelGraph.load(plain).trace_id is None  # no --trace: the graph names no trace nobody kept
