"""AutoDist's strategy protobuf (`autodist/proto/strategy.proto`, `synchronizers.proto`), as data.

Decoding checks a parsed text-format tree against these message definitions the way protobuf
would (unknown fields, wrong types, a singular field given twice, two members of a oneof) and
fills in proto3 defaults, so the mapping to Stratagem's IR only ever sees well-typed dicts.
"""

from __future__ import annotations

from typing import Any

from stratagem.errors import InvalidStrategyError, Problem
from stratagem.interop.textproto import Message, Scalar, TextField

SPEC = ["AUTO", "NCCL", "RING"]
AR_COMPRESSOR = ["NoneCompressor", "HorovodCompressor", "HorovodCompressorEF", "PowerSGDCompressor"]
"""`AllReduceSynchronizer.Compressor`; PowerSGDCompressor = 3 exists in AutoDist releases that ship PowerSGD."""
NODE_COMPRESSOR = ["NoneCompressor", "HorovodCompressor", "HorovodCompressorEF", "SFBCompressor"]
"""`autodist.proto.Compressor.Type`, the per-node compressor of later AutoDist versions."""

ENUMS: dict[str, list[str]] = {"Spec": SPEC, "ARCompressor": AR_COMPRESSOR, "NodeCompressor": NODE_COMPRESSOR}

# field name -> (type, repeated). Types: string, bool, int32, enum:<name>, a message name, or "opaque".
MESSAGES: dict[str, dict[str, tuple[str, bool]]] = {
    "Strategy": {
        "id": ("string", False),
        "path": ("string", False),
        "node_config": ("Node", True),
        "graph_config": ("GraphConfig", False),
    },
    "Node": {
        "var_name": ("string", False),
        "PSSynchronizer": ("PSSynchronizer", False),
        "AllReduceSynchronizer": ("AllReduceSynchronizer", False),
        "SFBSynchronizer": ("opaque", False),
        "partitioner": ("string", False),
        "part_config": ("Node", True),
        "compressor": ("Compressor", False),
    },
    "GraphConfig": {"replicas": ("string", True)},
    "PSSynchronizer": {
        "reduction_destination": ("string", False),
        "local_replication": ("bool", False),
        "sync": ("bool", False),
        "staleness": ("int32", False),
    },
    "AllReduceSynchronizer": {
        "spec": ("enum:Spec", False),
        "compressor": ("enum:ARCompressor", False),
        "group": ("int32", False),
    },
    "Compressor": {"type": ("enum:NodeCompressor", False)},
}

ONEOFS: dict[str, tuple[str, ...]] = {"Node": ("PSSynchronizer", "AllReduceSynchronizer", "SFBSynchronizer")}

_DEFAULTS: dict[str, Any] = {"string": "", "bool": False, "int32": 0}
_TRUE = {"true", "True", "t"}
_FALSE = {"false", "False", "f"}


def _fail(path: str, reason: str, line: int) -> InvalidStrategyError:
    return InvalidStrategyError([Problem(path, f"{reason} (line {line})")])


def decode(message: Message, type_name: str, path: str = "") -> dict[str, Any]:
    """A dict with every field of `type_name`: lists for repeated ones, None for absent messages."""
    schema = MESSAGES[type_name]
    result: dict[str, Any] = {}
    for item in message.fields:
        where = f"{path}.{item.name}" if path else item.name
        if item.name not in schema:
            known = ", ".join(schema)
            raise _fail(where, f"unknown field of AutoDist's {type_name} message (it has: {known})", item.line)
        field_type, repeated = schema[item.name]
        if repeated:
            items = result.setdefault(item.name, [])
            items.append(_value(item, field_type, f"{where}[{len(items)}]"))
        elif item.name in result:
            raise _fail(where, "given twice, but it is not a repeated field", item.line)
        else:
            result[item.name] = _value(item, field_type, where)
    _check_oneof(type_name, result, path, message.line)
    for name, (field_type, repeated) in schema.items():
        if name not in result:
            result[name] = [] if repeated else _default(field_type)
    return result


def _check_oneof(type_name: str, result: dict[str, Any], path: str, line: int) -> None:
    members = [name for name in ONEOFS.get(type_name, ()) if name in result]
    if len(members) > 1:
        raise _fail(path or type_name, f"sets both {members[0]} and {members[1]}; a node has one synchronizer", line)


def _default(field_type: str) -> Any:
    if field_type.startswith("enum:"):
        return ENUMS[field_type[5:]][0]
    return _DEFAULTS.get(field_type)


def _value(item: TextField, field_type: str, path: str) -> Any:
    value = item.value
    if field_type == "opaque":
        return value
    if field_type in MESSAGES:
        if not isinstance(value, Message):
            raise _fail(path, f"is a {field_type} message; write {item.name} {{ ... }}", item.line)
        return decode(value, field_type, path)
    if isinstance(value, Message):
        raise _fail(path, f"is a {field_type.removeprefix('enum:')} value, not a message", item.line)
    return _scalar(value, field_type, path)


def _scalar(value: Scalar, field_type: str, path: str) -> Any:
    if field_type == "string":
        if value.kind != "string":
            raise _fail(path, f"must be a quoted string, found {value.value!r}", value.line)
        return value.value
    if field_type == "bool":
        if value.kind == "ident" and value.value in _TRUE | _FALSE:
            return value.value in _TRUE
        if value.kind == "number" and value.value in (0, 1):
            return bool(value.value)
        raise _fail(path, f"must be true or false, found {value.value!r}", value.line)
    if field_type == "int32":
        if value.kind != "number" or not isinstance(value.value, int) or not -(2**31) <= value.value < 2**31:
            raise _fail(path, f"must be a 32-bit integer, found {value.value!r}", value.line)
        return value.value
    names = ENUMS[field_type[5:]]
    if value.kind == "ident" and value.value in names:
        return value.value
    if value.kind == "number" and isinstance(value.value, int) and 0 <= value.value < len(names):
        return names[value.value]
    raise _fail(path, f"must be one of {', '.join(names)}, found {value.value!r}", value.line)
