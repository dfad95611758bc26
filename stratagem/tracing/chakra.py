"""Export an OperatorTrace as an MLCommons Chakra execution trace (`.et`), for ASTRA-sim and PARAM.

The format is Chakra's protobuf schema, `schema/protobuf/et_def.proto` of github.com/mlcommons/chakra
(package `ChakraProtoMsg`): a file is a sequence of messages, each preceded by its length as a varint
(Chakra's `protolib.encodeMessage`), first one `GlobalMetadata`, then one `Node` per op. The wire
encoding is written here directly (the library does not depend on protobuf); the tests decode the
file with the protobuf runtime against the schema's field numbers and types.

Each op is a `COMP_NODE` named like PyTorch's execution trace names ops (`aten::convolution`), with
`data_deps` on the ops that wrote its input tensors and a `ctrl_deps` on the op before it (one
stream), `inputs`/`outputs` in PyTorch ET's string form (`values` holds `[tensor id, storage id,
offset, elements, element bytes, device]` per tensor), and attributes `op_schema`, `is_cpu_op`,
`num_ops` (FLOPs), `tensor_size` (bytes read and written), `layer` and `phase`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stratagem.tracing.optrace import PHASES, OperatorTrace, TraceOp, TraceTensor, tensor_refs

CHAKRA_VERSION = "0.0.4"
COMP_NODE = 4
"""`NodeType.COMP_NODE` in et_def.proto."""
_ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "complex64": 8,
    "complex128": 16,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
}

# Field numbers of et_def.proto.
_META_VERSION, _META_ATTR = 1, 2
_NODE_ID, _NODE_NAME, _NODE_TYPE, _NODE_CTRL, _NODE_DATA = 1, 2, 3, 4, 5
_NODE_INPUTS, _NODE_OUTPUTS, _NODE_ATTR = 8, 9, 10
_IO_VALUES, _IO_SHAPES, _IO_TYPES = 1, 2, 3
_ATTR_NAME, _ATTR_INT64, _ATTR_UINT64, _ATTR_BOOL, _ATTR_STRING = 1, 9, 13, 27, 29


# -- protobuf wire format ----------------------------------------------------------------------------


def varint(value: int) -> bytes:
    """Base-128 varint; negative int64 values take their 64-bit two's complement, as protobuf does."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(0x80 | bits)
        else:
            out.append(bits)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def _varint_field(field: int, value: int) -> bytes:
    return _key(field, 0) + varint(value) if value else b""


def _bytes_field(field: int, data: bytes) -> bytes:
    return _key(field, 2) + varint(len(data)) + data


def _string_field(field: int, text: str) -> bytes:
    return _bytes_field(field, text.encode()) if text else b""


def _packed_field(field: int, values: Iterable[int]) -> bytes:
    payload = b"".join(varint(v) for v in values)
    return _bytes_field(field, payload) if payload else b""


def _attribute(name: str, value: bool | int | str, *, unsigned: bool = False) -> bytes:
    """An AttributeProto: the name and one member of its `value` oneof (set even when zero or empty)."""
    body = _string_field(_ATTR_NAME, name)
    if isinstance(value, bool):
        body += _key(_ATTR_BOOL, 0) + varint(int(value))
    elif isinstance(value, int):
        body += _key(_ATTR_UINT64 if unsigned else _ATTR_INT64, 0) + varint(value)
    else:
        body += _bytes_field(_ATTR_STRING, value.encode())
    return body


def delimited(message: bytes) -> bytes:
    """One message as Chakra writes it: its length as a varint, then the message."""
    return varint(len(message)) + message


# -- the trace as nodes ------------------------------------------------------------------------------


def global_metadata(trace: OperatorTrace) -> bytes:
    attrs = [
        _attribute("generator", "stratagem"),
        _attribute("graph_name", trace.graph_name),
        _attribute("batch_size", trace.batch_size),
        _attribute("optimizer", trace.optimizer),
    ]
    return _string_field(_META_VERSION, CHAKRA_VERSION) + b"".join(_bytes_field(_META_ATTR, a) for a in attrs)


def nodes(trace: OperatorTrace) -> list[bytes]:
    """Every op of the step, forward then backward then optimizer, as encoded Node messages."""
    encoded: list[bytes] = []
    writer: dict[int, int] = {}
    previous: int | None = None
    for phase in PHASES:
        for op in trace.phase(phase):
            node_id = len(encoded)
            reads = list(dict.fromkeys(tensor_refs([op.args, list(op.kwargs.values())])))
            deps = sorted({writer[t] for t in reads if t in writer})
            encoded.append(_node(trace, op, node_id, phase, deps, previous))
            for tensor in tensor_refs(op.out):
                writer[tensor] = node_id
            previous = node_id
    return encoded


def _node(trace: OperatorTrace, op: TraceOp, node_id: int, phase: str, deps: list[int], previous: int | None) -> bytes:
    name = op.op.removesuffix(".default")
    arguments = [*op.args, *op.kwargs.values()]
    outputs = op.out if isinstance(op.out, list) else [] if op.out is None else [op.out]
    moved = sum(_nbytes(trace.tensors[t]) for t in tensor_refs([arguments, outputs]))
    attrs = [
        _attribute("op_schema", op.op),
        _attribute("is_cpu_op", False),
        _attribute("num_ops", round(op.flops)),
        _attribute("tensor_size", moved, unsigned=True),
        _attribute("layer", trace.layers[op.layer] if op.layer < len(trace.layers) else ""),
        _attribute("phase", phase),
    ]
    return b"".join(
        [
            _varint_field(_NODE_ID, node_id),
            _string_field(_NODE_NAME, name),
            _varint_field(_NODE_TYPE, COMP_NODE),
            _packed_field(_NODE_CTRL, [] if previous is None else [previous]),
            _packed_field(_NODE_DATA, deps),
            _bytes_field(_NODE_INPUTS, _io_info(trace, arguments)),
            _bytes_field(_NODE_OUTPUTS, _io_info(trace, outputs)),
            *(_bytes_field(_NODE_ATTR, a) for a in attrs),
        ]
    )


def _io_info(trace: OperatorTrace, values: list[Any]) -> bytes:
    described = [_describe(trace, v) for v in values]
    return b"".join(
        [
            _string_field(_IO_VALUES, repr([d[0] for d in described])),
            _string_field(_IO_SHAPES, repr([d[1] for d in described])),
            _string_field(_IO_TYPES, repr([d[2] for d in described])),
        ]
    )


def _describe(trace: OperatorTrace, value: Any) -> tuple[Any, Any, str]:
    """(value, shape, type) of one argument in PyTorch ET's spelling."""
    if isinstance(value, dict) and "t" in value:
        tensor = trace.tensors[value["t"]]
        itemsize = _ITEMSIZE.get(tensor.dtype, 1)
        return (
            [value["t"], tensor.storage, tensor.offset, tensor.numel, itemsize, "cpu"],
            list(tensor.shape),
            f"Tensor({tensor.dtype})",
        )
    if isinstance(value, list):
        parts = [_describe(trace, item) for item in value]
        inner = ",".join(p[2] for p in parts)
        return [p[0] for p in parts], [p[1] for p in parts], f"GenericList[{inner}]"
    if isinstance(value, dict):
        key, inner_value = next(iter(value.items()))
        return inner_value, [], key.capitalize()
    kind = (
        "None"
        if value is None
        else "Bool"
        if isinstance(value, bool)
        else "Int"
        if isinstance(value, int)
        else "Double"
        if isinstance(value, float)
        else "String"
    )
    return value, [], kind


def _nbytes(tensor: TraceTensor) -> int:
    return tensor.numel * _ITEMSIZE.get(tensor.dtype, 1)


def to_chakra(trace: OperatorTrace) -> bytes:
    """The whole `.et` file: the metadata message, then one Node per op, each length-prefixed."""
    return delimited(global_metadata(trace)) + b"".join(delimited(node) for node in nodes(trace))


def write_chakra(trace: OperatorTrace, path: str | Path) -> int:
    """Write the `.et` file; returns the number of nodes."""
    data = to_chakra(trace)
    Path(path).write_bytes(data)
    return trace.num_ops


def read_delimited(data: bytes) -> list[bytes]:
    """Split a `.et` file into its messages (the inverse of `delimited`, for checks and tools)."""
    messages, position = [], 0
    while position < len(data):
        length, shift = 0, 0
        while True:
            byte = data[position]
            position += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        messages.append(data[position : position + length])
        position += length
    return messages
