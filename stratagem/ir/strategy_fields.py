"""The parts a Strategy is made of: per-variable synchronizers and partitions, the mesh, the pipeline, tensor-parallel splits, consistency, and the predicted and measured performance that annotate it."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from stratagem.ir.document import Strict
from stratagem.ir.limits import (
    MAX_DEGREE,
    MAX_LAYERS,
    MAX_NOTES,
    MAX_VARIABLES,
    BoundedJSON,
    Degree,
    Name,
    OptionalName,
    Text,
)


class Compressor(Strict):
    kind: Literal["none", "fp16", "bf16", "powersgd", "topk"] = "none"
    rank: int | None = Field(default=None, ge=1, le=MAX_DEGREE)
    """PowerSGD's rank r: an m×n gradient travels as (m + n)·r numbers."""
    ratio: float | None = Field(default=None, gt=0, le=1)
    """Top-k's fraction of entries kept (values and indices travel)."""
    error_feedback: bool = True
    """Add what compression dropped to the next step's gradient."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.kind == "powersgd" and self.rank is None:
            raise ValueError("rank: required for the powersgd compressor")
        if self.kind == "topk" and self.ratio is None:
            raise ValueError("ratio: required for the topk compressor")
        if self.kind not in ("powersgd",) and self.rank is not None:
            raise ValueError(f"rank: only the powersgd compressor takes a rank, not {self.kind}")
        if self.kind != "topk" and self.ratio is not None:
            raise ValueError(f"ratio: only the topk compressor takes a ratio, not {self.kind}")
        return self


class AllReduceSynchronizer(Strict):
    kind: Literal["allreduce"] = "allreduce"
    algorithm: Literal["auto", "ring", "tree", "hierarchical"] = "auto"
    group: int = Field(default=0, ge=0, le=MAX_VARIABLES)
    """Fusion group: variables of one group are reduced together once the last of them is ready."""
    compressor: Compressor = Field(default_factory=Compressor)


class PSSynchronizer(Strict):
    kind: Literal["ps"] = "ps"
    reduction_destination: Name
    """The device holding the variable (or shard) and applying its updates, e.g. `10.0.0.1:CPU:0`."""
    local_replication: bool = False
    """Aggregate gradients inside a node before pushing (AutoDist's local proxy variable)."""
    sync: bool = True
    staleness: int = Field(default=0, ge=0, le=MAX_DEGREE)


ZeroStage = Literal[1, 2, 3]


class ShardedSynchronizer(Strict):
    """ZeRO-style sharding over the data-parallel group (Rajbhandari et al. 2020; FSDP)."""

    kind: Literal["sharded"] = "sharded"
    group: int = Field(default=0, ge=0, le=MAX_VARIABLES)
    stage: ZeroStage = 2
    """What is sharded: 1, the optimizer state (gradients all-reduced whole); 2, also the gradients
    (reduce-scattered); 3, also the parameters, all-gathered before each layer's forward and backward
    and freed after (FSDP's full shard). Stages 1 and 2 all-gather the updated parameters after the step."""
    shard_group: Degree | None = None
    """Hybrid sharding (HSDP, ZeRO++'s hpZ): shard over groups of this many consecutive data-parallel
    ranks and all-reduce the shards across groups; None shards over the whole data-parallel group."""


Synchronizer = Annotated[AllReduceSynchronizer | PSSynchronizer | ShardedSynchronizer, Field(discriminator="kind")]


class Partition(Strict):
    axis: int = Field(default=0, ge=0, le=64)
    shards: Degree


class VariableConfig(Strict):
    var_name: Name
    synchronizer: Synchronizer
    """How the variable (every shard, unless overridden) is synchronized."""
    partition: Partition | None = None
    shard_synchronizers: list[Synchronizer] | None = Field(default=None, max_length=MAX_DEGREE)
    """Per-shard overrides (AutoDist's `part_config`), one per shard when given."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.shard_synchronizers is not None:
            if self.partition is None:
                raise ValueError("shard_synchronizers: given but the variable is not partitioned")
            if len(self.shard_synchronizers) != self.partition.shards:
                raise ValueError(
                    f"shard_synchronizers: {len(self.shard_synchronizers)} given for {self.partition.shards} shards"
                )
        return self

    @property
    def num_shards(self) -> int:
        return self.partition.shards if self.partition else 1

    def shard_synchronizer(self, index: int) -> AllReduceSynchronizer | PSSynchronizer | ShardedSynchronizer:
        if self.shard_synchronizers is not None:
            return self.shard_synchronizers[index]
        return self.synchronizer

    @property
    def synchronizers(self) -> list[AllReduceSynchronizer | PSSynchronizer | ShardedSynchronizer]:
        return [self.shard_synchronizer(i) for i in range(self.num_shards)]


class Mesh(Strict):
    """Data × pipeline × context × tensor degrees over the replicas, in that nesting (tensor innermost):
    `rank = ((d · pipeline + p) · context + c) · tensor + t`."""

    data: Degree = 1
    tensor: Degree = 1
    pipeline: Degree = 1
    context: Degree = 1
    """Context parallelism: each sequence is split into this many pieces along its length, one per rank,
    and attention runs as a ring over them (ring attention); every other layer works on its piece."""

    @property
    def size(self) -> int:
        return self.data * self.tensor * self.pipeline * self.context

    def describe(self) -> str:
        context = f"*context({self.context})" if self.context > 1 else ""
        return f"data({self.data})*tensor({self.tensor})*pipeline({self.pipeline}){context}={self.size}"


PipelineSchedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"]


class PipelineConfig(Strict):
    stages: list[Annotated[list[Name], Field(max_length=MAX_LAYERS)]] = Field(min_length=1, max_length=MAX_DEGREE)
    """Layer names of each model chunk, in model order: `mesh.pipeline × virtual_stages` chunks, chunk i
    held by pipeline rank `i % mesh.pipeline` (Megatron's interleaving; `zero-bubble` with two virtual
    stages places its second chunks in reverse, as the V-shaped ZBV schedule does)."""
    micro_batches: Degree = 1
    """Micro-batches per step; with a single stage they are plain gradient accumulation."""
    schedule: PipelineSchedule = "1f1b"
    """`gpipe` (all forwards, then all backwards), `1f1b`, `interleaved-1f1b` (Narayanan et al. 2021:
    each rank holds `virtual_stages` chunks, bubble `(p − 1)/(v · m)`), `zero-bubble` (Qi et al. 2024:
    backward split into input and weight gradients, which fill the bubble)."""
    virtual_stages: Degree = 1
    """Model chunks per pipeline rank."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.schedule == "interleaved-1f1b" and self.virtual_stages < 2:
            raise ValueError("virtual_stages: interleaved-1f1b needs at least 2 chunks per rank")
        if self.schedule in ("gpipe", "1f1b") and self.virtual_stages != 1:
            raise ValueError(f"virtual_stages: {self.schedule} runs one chunk per rank, not {self.virtual_stages}")
        return self


TensorParallelStyle = Literal["colwise", "rowwise", "vocab", "heads"]


Recompute = Literal["none", "selective", "selective-op", "full"]


Precision = Literal["fp32", "tf32", "amp-fp16", "amp-bf16", "bf16", "fp8", "fp16"]


class TensorParallelLayer(Strict):
    """One module split across the tensor-parallel group, Megatron-style."""

    name: Name
    """Qualified module name: a layer of the graph (`blocks.0.mlp.fc`) or, for `heads`, the attention
    module that owns the projections (`blocks.0.attn`)."""
    style: TensorParallelStyle
    """`colwise`: a Linear's output features are split (input replicated, output sharded);
    `rowwise`: a Linear's input features are split (its output is all-reduced);
    `vocab`: an Embedding's rows, or an output-head Linear's rows (the vocabulary), are split;
    `heads`: an attention module's heads are split: its q/k/v projections column-wise, its output
    projection row-wise."""
    heads: Degree | None = None
    """Attention heads of the module (`heads` style only): the tensor degree must divide them."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.style == "heads" and self.heads is None:
            raise ValueError("heads: required for the heads style (the tensor degree must divide it)")
        if self.style != "heads" and self.heads is not None:
            raise ValueError(f"heads: only the heads style takes a head count, not {self.style}")
        return self


class Consistency(Strict):
    kind: Literal["bsp", "ssp", "asp"] = "bsp"
    staleness: int = Field(default=0, ge=0, le=MAX_DEGREE)
    """SSP's bound: a worker may run at most this many steps ahead of the slowest."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.kind == "ssp" and self.staleness < 1:
            raise ValueError("staleness: ssp needs a staleness bound of at least 1")
        if self.kind == "bsp" and self.staleness != 0:
            raise ValueError("staleness: bsp has no staleness; use kind 'ssp'")
        return self


class PredictedPerformance(Strict):
    step_time_s: float = Field(ge=0)
    samples_per_s: float = Field(ge=0)
    memory_per_device_bytes: float = Field(ge=0)
    """Peak memory of the fullest device."""
    feasible: bool = True
    infeasible_reason: str | None = None
    breakdown: dict[str, float] = Field(default_factory=dict)
    """Seconds per component (compute, exposed communication per kind, bubble, update)."""
    bottleneck: str = ""
    uncertainty: float | None = None
    """Relative width of the prediction's interval when a learned correction is applied."""
    simulated_step_time_s: float | None = Field(default=None, ge=0)
    """The analytic simulator's own step time when `step_time_s` is a learned correction of it
    (`breakdown` stays the simulator's); None when `step_time_s` is the simulator's."""


class MeasuredPerformance(Strict):
    step_time_s: float = Field(gt=0)
    """Median over the timed steps."""
    step_time_p90_s: float | None = Field(default=None, gt=0)
    samples_per_s: float = Field(ge=0)
    peak_memory_bytes: float | None = Field(default=None, ge=0)
    trials: int = Field(default=1, ge=1)


class Provenance(Strict):
    builder: OptionalName | None = None
    search: BoundedJSON | None = None
    simulator_version: OptionalName | None = None
    cost_model_version: OptionalName | None = None
    created_at: OptionalName | None = None
    notes: list[Text] = Field(default_factory=list, max_length=MAX_NOTES)
