"""OperatorTrace: every ATen op of one training step, as the dispatcher saw it during capture.

The graph says how much work each layer does; the trace says which kernels do it, on which shapes, in
which order. A trial of a model whose code the service never imports replays the trace
(`trial_runner.replay_trace`), so its step costs what the model's step costs, small convolutions,
per-op overheads and all. The trace is a content-addressed document like the graph, which refers to
it by `ModelGraph.trace_id`; on the wire and in the database it is gzip-compressed JSON
(`to_bytes` / `from_bytes`), never a pickle.

Tensors are numbered once (`tensors`) and ops refer to them by number. An argument of an op is JSON:
`{"t": i}` is tensor `i`; `{"dtype": "float32"}`, `{"device": "cpu"}`, `{"layout": "strided"}`,
`{"memory_format": "contiguous_format"}`, `{"float": "inf"}` (also `-inf`, `nan`) and
`{"complex": [re, im]}` stand for the torch values JSON cannot hold; `{"unsupported": "TypeName"}`
marks a value the trace could not write (the replay runs that op as a FLOP burn instead); lists,
numbers, strings, booleans and null are themselves.
"""

from __future__ import annotations

import gzip
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import Field, model_validator

from stratagem.errors import InvalidDocumentError, Problem
from stratagem.ir.document import Document, Strict, as_value_error

TRACE_DTYPES = frozenset(
    {
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "complex64",
        "complex128",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
    }
)
"""Element types a trace may name: torch's dtype names without `torch.`."""

SPECIAL_KEYS = frozenset({"t", "dtype", "device", "layout", "memory_format", "float", "complex", "unsupported"})
OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

MAX_OPS = 2_000_000
MAX_TENSORS = 4_000_000
MAX_CONSTANT_ELEMENTS = 4096
"""Constant tensors up to this many elements keep their values (index tables, small masks)."""
MAX_DEPTH = 8
"""Nesting of an argument (lists in lists); real ops need two (a list of optional tensors)."""
MAX_COMPRESSED_BYTES = 64 << 20
MAX_JSON_BYTES = 512 << 20
"""Decompression stops here: a small upload that inflates without end is refused, not expanded."""

Phase = Literal["forward", "backward", "optimizer"]
PHASES: tuple[Phase, ...] = ("forward", "backward", "optimizer")
Source = Literal["input", "parameter", "buffer", "state", "constant", "op"]


class TraceTensor(Strict):
    """One tensor of the step: a batch input, a parameter, a buffer, optimizer state, a constant, or an op's output."""

    shape: list[int]
    dtype: str
    stride: list[int] = Field(default_factory=list)
    """Empty for sparse tensors, which have none."""
    offset: int = Field(default=0, ge=0)
    """Storage offset, in elements."""
    storage: int = Field(default=-1, ge=-1)
    """Tensors that share a storage (views of one another) share this number; -1 when it has none (sparse)."""
    layout: Literal["strided", "sparse_coo", "sparse_csr", "other"] = "strided"
    source: Source = "op"
    name: str | None = None
    """The parameter's or buffer's name (`named_parameters()` / `named_buffers()`), `<param>:<slot>` for
    optimizer state, or the input's position among the tensors of the example inputs."""
    requires_grad: bool = False
    saved: bool = False
    """Autograd saved it for backward: an activation the real step holds until its backward runs."""
    data: list[Any] | None = None
    """The values of a small constant (an index table, a mask), flattened, when capture knew them."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        problems = []
        if self.dtype not in TRACE_DTYPES:
            problems.append(Problem("dtype", f"unknown dtype {self.dtype!r}"))
        if any(d < 0 for d in self.shape):
            problems.append(Problem("shape", f"dimensions must be 0 or more, got {self.shape}"))
        if self.layout == "strided" and len(self.stride) != len(self.shape):
            problems.append(Problem("stride", f"has {len(self.stride)} entries for {len(self.shape)} dimensions"))
        if self.source in ("parameter", "buffer", "state") and not self.name:
            problems.append(Problem("name", f"a {self.source} tensor needs its name"))
        if self.data is not None and len(self.data) > MAX_CONSTANT_ELEMENTS:
            problems.append(Problem("data", f"holds {len(self.data)} values; at most {MAX_CONSTANT_ELEMENTS}"))
        as_value_error(problems)
        return self

    @property
    def numel(self) -> int:
        count = 1
        for d in self.shape:
            count *= d
        return count


class TraceOp(Strict):
    """One call of an ATen op (or another dispatcher op) and the layer whose work it is."""

    op: str
    """`namespace::name.overload`, e.g. `aten::convolution.default`."""
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    out: Any = None
    """The output in the arguments' encoding: `{"t": i}`, a list of them, or a non-tensor value."""
    layer: int = Field(default=0, ge=0)
    """Index into `OperatorTrace.layers`."""
    grad: bool = True
    """Grad mode was on (forward ops): the op recorded its backward on the autograd tape."""
    flops: float = Field(default=0.0, ge=0)


class OperatorTrace(Document):
    """The ops of one training step of one replica, at the graph's batch size."""

    _error_type: ClassVar = InvalidDocumentError

    graph_name: str = "model"
    batch_size: int = Field(gt=0)
    optimizer: str = "adam"
    layers: list[str] = Field(default_factory=list)
    """Layer names as in the graph (and `<optimizer>` for the update), referred to by index."""
    tensors: list[TraceTensor]
    inputs: list[int] = Field(default_factory=list)
    """The batch's tensors, in the order of the example inputs' leaves."""
    loss: int | None = None
    """The scalar whose backward the step runs."""
    forward: list[TraceOp]
    backward: list[TraceOp] = Field(default_factory=list)
    optimizer_step: list[TraceOp] = Field(default_factory=list)
    """A steady-state update (the optimizer's state already exists), as the first trained step after it."""
    gradients: dict[str, int] = Field(default_factory=dict)
    """Each parameter's `.grad` after backward, by variable name."""
    notes: list[str] = Field(default_factory=list)
    """What capture could not record, in words (an optimizer whose update depends on values, ...)."""
    provenance: dict[str, Any] = Field(default_factory=dict)
    """torch version and recording time; not part of the id."""

    @model_validator(mode="after")
    def _check_references(self) -> Self:
        as_value_error(trace_problems(self)[:20])
        return self

    def phase(self, name: Phase) -> list[TraceOp]:
        return {"forward": self.forward, "backward": self.backward, "optimizer": self.optimizer_step}[name]

    @property
    def num_ops(self) -> int:
        return len(self.forward) + len(self.backward) + len(self.optimizer_step)

    def summary(self) -> str:
        return (
            f"{self.graph_name}: {len(self.forward)} forward, {len(self.backward)} backward and "
            f"{len(self.optimizer_step)} optimizer ops over {len(self.tensors)} tensors"
        )

    # -- compressed JSON ---------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """gzip of the JSON, with a fixed timestamp so that one trace always compresses to the same bytes."""
        buffer = io.BytesIO()
        with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=6, mtime=0) as stream:
            stream.write(self.model_dump_json().encode())
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, *, max_json_bytes: int = MAX_JSON_BYTES) -> OperatorTrace:
        """Parse gzip-compressed (or plain) JSON; refuse what is not gzip, not JSON or inflates past the limit."""
        return cls.parse(inflate(data, max_json_bytes=max_json_bytes))

    def save(self, path: str | Path) -> None:
        """`.gz` files get the compressed form, any other name plain JSON."""
        target = Path(path)
        if target.suffix == ".gz":
            target.write_bytes(self.to_bytes())
        else:
            super().save(target)

    @classmethod
    def load(cls, path: str | Path) -> Self:
        return cls.parse(inflate(Path(path).read_bytes(), max_json_bytes=MAX_JSON_BYTES))


def inflate(data: bytes, *, max_json_bytes: int) -> bytes:
    """The JSON inside gzip bytes (plain JSON passes through), read in pieces so a bomb stops at the limit."""
    if not data.startswith(b"\x1f\x8b"):
        if len(data) > max_json_bytes:
            raise InvalidDocumentError([Problem("", f"{len(data)} bytes of JSON; the limit is {max_json_bytes}")])
        return data
    out = io.BytesIO()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            while chunk := stream.read(1 << 20):
                out.write(chunk)
                if out.tell() > max_json_bytes:
                    raise InvalidDocumentError(
                        [Problem("", f"decompresses past {max_json_bytes} bytes, the limit for an operator trace")],
                        document="operator trace",
                    )
    except (OSError, EOFError) as error:
        raise InvalidDocumentError([Problem("", f"not valid gzip data: {error}")], document="operator trace") from None
    return out.getvalue()


def tensor_refs(value: Any) -> Iterator[int]:
    """Every tensor number an encoded argument or output refers to, in order."""
    if isinstance(value, dict):
        ref = value.get("t")
        if isinstance(ref, int) and not isinstance(ref, bool):
            yield ref
    elif isinstance(value, list):
        for item in value:
            yield from tensor_refs(item)


def trace_problems(trace: OperatorTrace) -> list[Problem]:
    """What would make a replay read a tensor that does not exist yet, or call an op by a bad name."""
    problems: list[Problem] = []
    count = len(trace.tensors)
    if trace.num_ops > MAX_OPS:
        problems.append(Problem("forward", f"{trace.num_ops} ops; an operator trace holds at most {MAX_OPS}"))
    if count > MAX_TENSORS:
        problems.append(Problem("tensors", f"{count} tensors; at most {MAX_TENSORS}"))
    defined = [t.source != "op" for t in trace.tensors]
    for i, ref in enumerate(trace.inputs):
        if not 0 <= ref < count or trace.tensors[ref].source != "input":
            problems.append(Problem(f"inputs[{i}]", f"{ref} is not an input tensor of this trace"))
    for phase in PHASES:
        for i, op in enumerate(trace.phase(phase)):
            problems.extend(_op_problems(op, f"{_field(phase)}[{i}]", defined, len(trace.layers)))
            for ref in tensor_refs(op.out):
                if 0 <= ref < count:
                    defined[ref] = True
            if len(problems) > 20:
                return problems
    if trace.loss is not None and not (0 <= trace.loss < count and defined[trace.loss]):
        problems.append(Problem("loss", f"{trace.loss} is not a tensor the forward ops produce"))
    for name, ref in trace.gradients.items():
        if not 0 <= ref < count:
            problems.append(Problem(f"gradients.{name}", f"{ref} is not a tensor of this trace"))
    return problems


def _field(phase: Phase) -> str:
    return "optimizer_step" if phase == "optimizer" else phase


def _op_problems(op: TraceOp, where: str, defined: list[bool], layers: int) -> list[Problem]:
    problems = []
    if not OP_NAME.match(op.op):
        problems.append(Problem(f"{where}.op", f"{op.op!r} is not an op name like aten::mm.default"))
    if layers and op.layer >= layers:
        problems.append(Problem(f"{where}.layer", f"{op.layer} is not a layer index (there are {layers})"))
    for key in op.kwargs:
        if not IDENTIFIER.match(key):
            problems.append(Problem(f"{where}.kwargs", f"{key!r} is not an argument name"))
    for path, value in (("args", op.args), ("kwargs", list(op.kwargs.values())), ("out", op.out)):
        reason = _encoding_problem(value, 0)
        if reason is not None:
            problems.append(Problem(f"{where}.{path}", reason))
    for ref in [*tensor_refs(op.args), *tensor_refs(list(op.kwargs.values()))]:
        if not 0 <= ref < len(defined) or not defined[ref]:
            problems.append(Problem(f"{where}.args", f"reads tensor {ref} before any op made it"))
            break
    for ref in tensor_refs(op.out):
        if not 0 <= ref < len(defined):
            problems.append(Problem(f"{where}.out", f"{ref} is not a tensor of this trace"))
            break
    return problems


def _encoding_problem(value: Any, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if value is None or isinstance(value, (bool, int, float, str)):
        return None
    if isinstance(value, list):
        for item in value:
            reason = _encoding_problem(item, depth + 1)
            if reason is not None:
                return reason
        return None
    if isinstance(value, dict):
        if len(value) != 1 or next(iter(value)) not in SPECIAL_KEYS:
            return f"an object argument must be one of {sorted(SPECIAL_KEYS)}, got keys {sorted(value)[:4]}"
        key, inner = next(iter(value.items()))
        if key == "t" and (isinstance(inner, bool) or not isinstance(inner, int)):
            return f"a tensor reference needs a tensor number, got {inner!r}"
        if key == "complex" and not (isinstance(inner, list) and len(inner) == 2):
            return "a complex value is [real, imaginary]"
        if key in ("dtype", "device", "layout", "memory_format", "float", "unsupported") and not isinstance(inner, str):
            return f"{key} must be a string"
        return None
    return f"{type(value).__name__} is not an encoded argument"


def trace_graph_problems(trace: OperatorTrace, graph: Any) -> list[Problem]:
    """A trace belongs to a graph when the graph names it and every parameter it reads is a variable of
    the graph with the same shape (`graph` is a ModelGraph; typed loosely to keep the IR free of tracing)."""
    problems = []
    if graph.trace_id != trace.id:
        problems.append(Problem("graph.trace_id", f"is {graph.trace_id!r}, but the trace's id is {trace.id!r}"))
    shapes = {v.name: list(v.shape) for v in graph.variables}
    for index, tensor in enumerate(trace.tensors):
        if tensor.source != "parameter":
            continue
        if tensor.name not in shapes:
            problems.append(Problem(f"trace.tensors[{index}].name", f"{tensor.name!r} is not a variable of the graph"))
        elif shapes[tensor.name] != tensor.shape:
            problems.append(
                Problem(
                    f"trace.tensors[{index}].shape",
                    f"parameter {tensor.name!r} is {tensor.shape} in the trace, {shapes[tensor.name]} in the graph",
                )
            )
        if len(problems) >= 10:
            break
    return problems
