"""ModelGraph: what the simulator needs to know about one training step of one replica.

Names are the contract with the user's model: a layer's `name` is the module's qualified name
(`model.named_modules()`), a variable's `name` is the parameter's (`model.named_parameters()`), so a
strategy written for the graph applies to the model without a mapping table.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self, get_args

from pydantic import Field, PrivateAttr, model_validator

from stratagem.errors import InvalidGraphError, Problem
from stratagem.ir.document import Document, Strict, as_value_error
from stratagem.ir.dtypes import DType
from stratagem.ir.limits import (
    MAX_BATCH_SIZE,
    MAX_DIM,
    MAX_LAYERS,
    MAX_LOOKUPS,
    MAX_NUMEL,
    MAX_PARAMETERS,
    MAX_RANK,
    MAX_REFERENCES,
    MAX_VARIABLES,
    BoundedJSON,
    Bytes,
    Flops,
    Name,
    OptionalName,
)

if TYPE_CHECKING:
    from stratagem.tracing.optrace import OperatorTrace


class LayerKind(StrEnum):
    """Coarse class of a layer's work, used to pick a compute efficiency."""

    matmul = "matmul"
    conv = "conv"
    attention = "attention"
    embedding = "embedding"
    norm = "norm"
    elementwise = "elementwise"
    other = "other"


class FusedAttention(Strict):
    """The fused attention kernel a layer calls (`scaled_dot_product_attention`). On a GPU it runs as one
    FlashAttention-style kernel that never writes the s x s scores, whatever capture decomposed it into
    here; the simulator prices it from these figures instead of the traced ops."""

    flops: Flops
    """Forward FLOPs of the calls over the full score matrix (QK^T and PV), before causal skipping."""
    traced_bytes: Bytes
    """Of the layer's `bytes_moved`, what the traced calls moved (a math decomposition's s x s passes)."""
    io_bytes: Bytes
    """Bytes a fused kernel streams in forward: queries, keys and values read, the output written."""
    causal: bool = False
    """Causal masking (`is_causal`): a fused kernel skips the tiles above the diagonal, about half the work."""


class Layer(Strict):
    name: Name
    """Qualified module name, unique in the graph."""
    type: OptionalName = "Module"
    """The module's class name, e.g. `Linear`."""
    kind: LayerKind = LayerKind.other
    fwd_flops: Flops = 0.0
    """Floating-point operations of the forward pass at the graph's batch size."""
    bwd_flops: Flops = 0.0
    """Operations of the backward pass (input and weight gradients)."""
    bytes_moved: Bytes = 0.0
    """Bytes read and written from device memory in the forward pass (for the roofline)."""
    activation_bytes: Bytes = 0.0
    """Bytes saved for backward, deduplicated by storage."""
    output_bytes: Bytes = 0.0
    inputs: list[Name] = Field(default_factory=list, max_length=MAX_REFERENCES)
    """Earlier layers this one reads from; empty means it reads the batch."""
    variables: list[Name] = Field(default_factory=list, max_length=MAX_REFERENCES)
    """Variables (parameters) this layer uses."""
    gpu_activation_bytes: Bytes | None = None
    """Of `activation_bytes`, what a GPU keeps: its fused dropout saves a one-byte mask where the CPU
    decomposition this graph was captured through saves an fp32 noise tensor. None means the same."""
    arithmetic_bytes: Bytes | None = None
    """What the layer's matmuls, convolutions and lookups move (their operands and results), apart from
    its element-wise kernels and fused attention. None when capture did not record the split."""
    elementwise_bytes: Bytes = 0.0
    """What the layer's element-wise and normalization kernels move on a GPU (everything but its
    matmuls, convolutions, fused attention and lookups; dropout as PyTorch's one fused kernel): kernels
    of their own, which stream at memory bandwidth after the arithmetic ones rather than beside them."""
    fused_elementwise_bytes: Bytes | None = None
    """What those element-wise kernels move when a compiler fuses each chain between two arithmetic
    kernels into one (`torch.compile`): a chain reads its inputs once and writes only what a later
    kernel or backward reads. None when capture did not record it."""
    autocast_elementwise_bytes: Bytes | None = None
    """What the element-wise kernels move under `torch.autocast`: half-precision tensors, fp32 where
    autocast keeps one (its fp32 ops, what they feed, parameters), and the casts between
    (`stratagem.tracing.autocast`). Absolute bytes, whatever dtype the graph was captured in; None when
    capture did not record it."""
    attention: FusedAttention | None = None
    """The fused attention kernel the layer calls, if any."""


class Variable(Strict):
    name: Name
    """Qualified parameter name, unique in the graph."""
    shape: list[Annotated[int, Field(le=MAX_DIM)]] = Field(max_length=MAX_RANK)
    dtype: DType = DType.float32
    trainable: bool = True
    sparse: bool = False
    """An embedding with sparse gradients: only the rows looked up change in a step."""
    lookups_per_step: int | None = Field(default=None, ge=0, le=MAX_LOOKUPS)
    """For sparse variables: rows looked up per step at the graph's batch size (with repeats)."""
    consumer: Name | None = None
    """The layer that uses it; its backward decides when the gradient is ready."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        """Bytes of one row along axis 0, what a sparse lookup moves."""
        return (self.numel // self.shape[0]) * self.dtype.itemsize if self.shape else self.nbytes

    @model_validator(mode="after")
    def _check(self) -> Self:
        problems = [Problem(f"shape[{i}]", f"must be positive, got {d}") for i, d in enumerate(self.shape) if d <= 0]
        if not problems and math.prod(self.shape) > MAX_NUMEL:
            problems.append(
                Problem("shape", f"{math.prod(self.shape):.3g} elements; at most {MAX_NUMEL:.3g} per variable")
            )
        if self.sparse and self.lookups_per_step is None:
            problems.append(Problem("lookups_per_step", "is required for a sparse variable"))
        if self.sparse and len(self.shape) < 1:
            problems.append(Problem("shape", "a sparse variable needs at least one axis (its rows)"))
        as_value_error(problems)
        return self


class Architecture(Strict):
    """The shape of a transformer, where the graph came from one (a zoo or Hugging Face config): what a
    layout is checked against (heads by the tensor degree, blocks by the pipeline stages, the sequence by
    the context degree) and what the simulator's sequence-dependent terms read."""

    layers: int = Field(ge=1)
    """Transformer blocks."""
    hidden: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int | None = Field(default=None, ge=1)
    """Key/value heads under grouped-query attention; None means `heads`."""
    ffn: int = Field(ge=1)
    seq: int = Field(ge=1)
    """Sequence length the graph was captured at."""
    vocab: int = Field(ge=1)
    causal: bool = True


OptimizerKind = Literal["sgd", "momentum", "adam", "adamw", "adagrad", "rmsprop", "lamb"]

OPTIMIZER_STATE_SLOTS: dict[str, int] = {
    "sgd": 0,
    "momentum": 1,
    "adagrad": 1,
    "rmsprop": 1,
    "adam": 2,
    "adamw": 2,
    "lamb": 2,
}


OptimizerImplementation = Literal["multi-tensor", "for-loop", "fused"]


class OptimizerSpec(Strict):
    kind: OptimizerKind = "adam"
    state_bytes_per_param: float = Field(default=8.0, ge=0)
    """Optimizer state per parameter (Adam in fp32: two moments, 8 bytes)."""
    implementation: OptimizerImplementation = "multi-tensor"
    """How the update runs. `multi-tensor`: each operation is its own kernel, launched once for many
    tensors (PyTorch's `foreach` path, its default on CUDA; an unfused optimizer stepping a flat buffer,
    as DeepSpeed's ZeRO and fp16 optimizers step a client's). `for-loop`: each operation launches once per
    tensor (`foreach=False`, PyTorch's default on a CPU; transformers' own `AdamW`, which its Trainer
    stepped in version 4.12). `fused`: one kernel reads and writes each tensor once (`fused=True`; apex's
    and DeepSpeed's `FusedAdam`, which Megatron-LM steps)."""
    max_grad_norm: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Clip the step's gradient to this global L2 norm before the update (`clip_grad_norm_`; Megatron-LM's
    `--clip-grad`, torchtitan's `training.max_norm`, Hugging Face's `max_grad_norm`); None clips nothing.
    The norm is the whole model's, taken after gradients are averaged, across every rank's shards."""

    @classmethod
    def of(
        cls,
        kind: str,
        param_itemsize: int = 4,
        implementation: str = "multi-tensor",
        max_grad_norm: float | None = None,
    ) -> OptimizerSpec:
        if kind not in OPTIMIZER_STATE_SLOTS:
            known = ", ".join(OPTIMIZER_STATE_SLOTS)
            raise InvalidGraphError([Problem("optimizer.kind", f"unknown optimizer {kind!r} (known: {known})")])
        if implementation not in get_args(OptimizerImplementation):
            known = ", ".join(get_args(OptimizerImplementation))
            raise InvalidGraphError(
                [Problem("optimizer.implementation", f"unknown implementation {implementation!r} (known: {known})")]
            )
        if max_grad_norm is not None and not (math.isfinite(max_grad_norm) and max_grad_norm > 0):
            raise InvalidGraphError(
                [Problem("optimizer.max_grad_norm", f"must be a positive finite norm, got {max_grad_norm!r}")]
            )
        return cls(
            kind=kind,  # type: ignore[arg-type]
            state_bytes_per_param=OPTIMIZER_STATE_SLOTS[kind] * param_itemsize,
            implementation=implementation,  # type: ignore[arg-type]
            max_grad_norm=max_grad_norm,
        )


class ModelGraph(Document):
    _error_type: ClassVar = InvalidGraphError

    name: OptionalName = "model"
    batch_size: int = Field(gt=0, le=MAX_BATCH_SIZE)
    """The per-replica batch size the FLOPs and bytes were recorded at."""
    dtype: DType = DType.float32
    """Default compute dtype (picks the device's peak FLOP/s)."""
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    layers: list[Layer] = Field(min_length=1, max_length=MAX_LAYERS)
    """At least one: a step with no layer does no work to distribute."""
    variables: list[Variable] = Field(max_length=MAX_VARIABLES)
    architecture: Architecture | None = None
    """The transformer's shape, where known; None for other models and hand-built graphs."""
    trace_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """Content id of the step's operator trace (`stratagem.tracing.OperatorTrace`), stored beside the
    graph; None when capture recorded none. A trial replays the trace when the service holds it."""
    provenance: BoundedJSON = Field(default_factory=dict)
    """Where the graph came from (capture, zoo model and config, torch version); not part of the id. A record
    only: it never configures what a trial builds."""

    _trace: Any = PrivateAttr(default=None)

    @property
    def trace(self) -> OperatorTrace | None:
        """The operator trace held beside this graph in memory (capture attaches it; JSON carries only its id)."""
        return self._trace

    def attach_trace(self, trace: OperatorTrace) -> Self:
        """Keep `trace` beside the graph, so uploads and replays find it; it must be the one `trace_id` names.
        Parsing, `replace` and `load` give a graph without it (JSON carries the id only)."""
        if trace.id != self.trace_id:
            raise InvalidGraphError(
                [Problem("trace_id", f"is {self.trace_id!r}, but the trace given has id {trace.id!r}")]
            )
        self._trace = trace
        return self

    @model_validator(mode="after")
    def _check_references(self) -> Self:
        as_value_error(graph_problems(self))
        return self

    def variable(self, name: str) -> Variable:
        """One lookup; a caller asking for many variables takes `variables_by_name()` once instead (an index
        kept on the graph would make equal graphs compare unequal, as pydantic compares private state)."""
        return self.variables_by_name()[name]

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    def variables_by_name(self) -> dict[str, Variable]:
        return {v.name: v for v in self.variables}

    def variable_layers(self) -> dict[str, str]:
        """Each variable's layer, whose backward makes its gradient: its `consumer`, else the first layer
        that lists it; a variable no layer uses is absent."""
        layers: dict[str, str] = {}
        for layer in self.layers:
            for name in layer.variables:
                layers.setdefault(name, layer.name)
        for variable in self.variables:
            if variable.consumer is not None:
                layers[variable.name] = variable.consumer
        return layers

    @property
    def trainable_variables(self) -> list[Variable]:
        return [v for v in self.variables if v.trainable]

    @property
    def num_parameters(self) -> int:
        return sum(v.numel for v in self.variables)

    @property
    def parameter_bytes(self) -> int:
        return sum(v.nbytes for v in self.variables)

    @property
    def total_flops(self) -> float:
        return sum(layer.fwd_flops + layer.bwd_flops for layer in self.layers)

    def summary(self) -> str:
        sparse = sum(1 for v in self.variables if v.sparse)
        return (
            f"{self.name}: {len(self.layers)} layers, {len(self.variables)} variables "
            f"({sparse} sparse), {self.num_parameters / 1e6:.1f}M parameters, "
            f"{self.total_flops / 1e9:.1f} GFLOP per step at batch {self.batch_size}"
        )


def graph_problems(graph: ModelGraph) -> list[Problem]:
    """Cross-reference rules: unique names, inputs only from earlier layers, variables exist."""
    problems: list[Problem] = []
    seen_layers: set[str] = set()
    variable_names: set[str] = set()
    for i, var in enumerate(graph.variables):
        if var.name in variable_names:
            problems.append(Problem(f"variables[{i}].name", f"duplicate variable name {var.name!r}"))
        variable_names.add(var.name)
    layer_names = {layer.name for layer in graph.layers}
    for i, layer in enumerate(graph.layers):
        if layer.name in seen_layers:
            problems.append(Problem(f"layers[{i}].name", f"duplicate layer name {layer.name!r}"))
        for j, source in enumerate(layer.inputs):
            if source not in seen_layers:
                where = "a later layer" if source in layer_names else "not a layer of this graph"
                problems.append(
                    Problem(
                        f"layers[{i}].inputs[{j}]", f"{source!r} is {where}; a layer reads only from earlier layers"
                    )
                )
        for j, var_name in enumerate(layer.variables):
            if var_name not in variable_names:
                problems.append(Problem(f"layers[{i}].variables[{j}]", f"unknown variable {var_name!r}"))
        seen_layers.add(layer.name)
    for i, var in enumerate(graph.variables):
        if var.consumer is not None and var.consumer not in layer_names:
            problems.append(Problem(f"variables[{i}].consumer", f"unknown layer {var.consumer!r}"))
    if graph.num_parameters > MAX_PARAMETERS:
        problems.append(Problem("variables", f"{graph.num_parameters:.3g} parameters; at most {MAX_PARAMETERS:.3g}"))
    return problems
