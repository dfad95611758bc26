"""Layout: the vocabulary GPU teams configure training in, as a validated document.

Data × tensor × pipeline × context degrees, ZeRO/FSDP stage (and a hybrid shard group), micro-batch
and global batch, pipeline schedule, activation recomputation, precision and sequence parallelism: what
torchtitan, Megatron-LM, DeepSpeed and Accelerate configs state. `build(graph, resources)` turns a layout
into a Strategy (the tensor plan from `stratagem.tensor_plan`, stage cuts from `stratagem.stages`, every
variable all-reduced or sharded); `layout_of(strategy)` (`Strategy.layout()`) reads one back.

The graph is captured at the micro-batch: `micro_batches = global_batch / (micro_batch × data)` is how
many micro-batches each replica runs per optimizer step (pipeline micro-batches, or gradient
accumulation without a pipeline). A degree left None is filled by `build()` from the device count, as
torchtitan's `-1` is: `data` first, the others as 1. Problems carry the arithmetic, as torchtitan's
`ParallelDims` does: `data(2)*tensor(4)*pipeline(2)*context(1)=16 != devices(32)`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal, Self

from pydantic import Field, model_validator

from stratagem.errors import InvalidLayoutError, Problem, UnsupportedStrategyError
from stratagem.ir import (
    AllReduceSynchronizer,
    Mesh,
    ModelGraph,
    PipelineSchedule,
    Precision,
    Recompute,
    ResourceSpec,
    ShardedSynchronizer,
    Strategy,
    device_address,
)
from stratagem.ir.document import Document, as_value_error

ZeroLevel = Literal[0, 1, 2, 3]
MAX_MICRO_BATCHES = 1 << 20
"""Micro-batches per replica per step beyond which a layout is a typo (the simulator counts them in int32)."""
DEGREES = ("data", "tensor", "pipeline", "context")


class Layout(Document):
    """A parallel layout; every field has a default, so `Layout(tensor=4, pipeline=2)` is a layout."""

    _error_type: ClassVar = InvalidLayoutError

    data: int | None = Field(default=None, ge=1)
    """Data-parallel degree (replicas of the model); None: the devices the other degrees leave."""
    tensor: int | None = Field(default=1, ge=1)
    """Tensor-parallel degree (Megatron's column/row splits, inside one node); None: 1."""
    pipeline: int | None = Field(default=1, ge=1)
    """Pipeline-parallel degree (ranks, not chunks); None: 1."""
    context: int | None = Field(default=1, ge=1)
    """Context-parallel degree (ring attention over pieces of the sequence); None: 1."""
    micro_batch: int | None = Field(default=None, ge=1)
    """Samples per micro-batch on one replica; None: the graph's batch (it is captured at the micro-batch)."""
    global_batch: int | None = Field(default=None, ge=1)
    """Samples per optimizer step over all replicas; None: `micro_batch × micro_batches × data`."""
    micro_batches: int | None = Field(default=None, ge=1, le=MAX_MICRO_BATCHES)
    """Micro-batches per replica per step; None: `global_batch / (micro_batch × data)`, or 1 without a
    global batch. Importers set it where a config states it without the data degree (DeepSpeed's
    gradient accumulation steps, torchtitan's pipeline micro-batches)."""
    schedule: PipelineSchedule = "1f1b"
    """Pipeline schedule: `gpipe`, `1f1b`, `interleaved-1f1b` (with `virtual_stages` > 1), `zero-bubble`."""
    virtual_stages: int = Field(default=1, ge=1)
    """Model chunks per pipeline rank (interleaving)."""
    zero: ZeroLevel = 0
    """0: every variable all-reduced (DDP); 1: optimizer state sharded over the data-parallel group;
    2: also gradients; 3: also parameters (FSDP's full shard)."""
    shard_group: int | None = Field(default=None, ge=1)
    """Hybrid sharding: shard over groups of this many data-parallel ranks, replicate across them."""
    bucket_mb: int | None = Field(default=None, ge=1)
    """DDP's gradient bucket cap in MiB (`bucket_cap_mb`) at zero 0; None: PyTorch's 25. A bucket's
    all-reduce starts once backward has made all of its gradients, so larger buckets leave more of the
    last one after backward; the first bucket still closes at DDP's 1 MiB."""
    overlap_grad_reduce: bool = True
    """Gradients are reduced during backward, as they become ready (DDP's buckets; Megatron's
    `--overlap-grad-reduce`; DeepSpeed's `overlap_comm`). False: each pipeline chunk's gradients are
    reduced in one collective after its backward, as DeepSpeed's stage 0, and its stages 1 and 2 without
    `overlap_comm` (their default), do. Zero 3 always overlaps."""
    recompute: Recompute = "none"
    """Activation recomputation: `selective` (the attention core, as Megatron), `selective-op` (per-op
    checkpointing, torchtitan's `selective_ac_option = "op"`) or `full` blocks."""
    precision: Precision = "fp32"
    """`fp32`, `tf32`, `amp-fp16`, `amp-bf16` (fp32 master weights), `bf16`, `fp8` (fp8 matmuls, bf16 elsewhere)."""
    sequence_parallel: bool = False
    """Norms and dropout split along the sequence inside the tensor group (needs tensor > 1)."""
    async_tensor_parallel: bool = False
    """Sequence parallelism's all-gathers and reduce-scatters overlapped with the matmuls they feed and
    drain, piece by piece (torchtitan's `enable_async_tensor_parallel`; needs sequence_parallel)."""
    fp8_all_gather: bool = False
    """FSDP gathers the fp8 Linears' weights in fp8 (torchao's `enable_fsdp_float8_all_gather`; needs
    precision fp8 and zero 3)."""
    compile: bool = False
    """`torch.compile` each block (torchtitan's `[compile]`): element-wise chains run as fused kernels."""

    @model_validator(mode="after")
    def _check_self(self) -> Self:
        as_value_error(layout_problems(self))
        return self

    # --- text ------------------------------------------------------------------------------------

    @classmethod
    def from_string(cls, text: str) -> Layout:
        """`"dp=8,tp=4,pp=2,mb=1,gbs=512,recompute=selective,precision=amp-bf16"` (see `LAYOUT_KEYS`)."""
        from stratagem.layout_text import parse_layout

        return parse_layout(text)

    def __str__(self) -> str:
        from stratagem.layout_text import layout_text

        return layout_text(self)

    # --- filling and building --------------------------------------------------------------------

    def resolved(self, devices: int) -> Layout:
        """The layout with every degree filled for `devices` devices (None data takes what is left)."""
        degrees = {name: getattr(self, name) for name in DEGREES}
        others = {name: value or 1 for name, value in degrees.items() if name != "data"}
        product = math.prod(others.values())
        shown = "*".join(f"{name}({value})" for name, value in others.items())
        data = degrees["data"]
        if data is None:
            if devices % product:
                raise InvalidLayoutError([Problem("data", f"{shown}={product} does not divide devices({devices})")])
            data = devices // product
        elif data * product != devices:
            raise InvalidLayoutError([Problem("data", f"data({data})*{shown}={data * product} != devices({devices})")])
        return type(self).parse({**self.model_dump(mode="json", exclude={"id"}), "data": data, **others})

    def build(self, graph: ModelGraph, resources: ResourceSpec) -> Strategy:
        """The strategy this layout describes for `graph` on all of `resources`' compute devices."""
        from stratagem.layout_build import build_strategy

        return build_strategy(self, graph, resources)

    def batch(self, graph_batch: int) -> tuple[int, int, int]:
        """(micro_batch, micro_batches, global_batch) on a graph captured at `graph_batch`, for a
        resolved layout; raises with the arithmetic where they disagree."""
        data = self.data or 1
        micro = self.micro_batch or graph_batch
        problems = []
        if micro != graph_batch:
            problems.append(
                Problem(
                    "micro_batch",
                    f"the graph was captured at batch {graph_batch}, not micro_batch({micro}); "
                    "capture it at the micro-batch",
                )
            )
        per_step = micro * data
        if self.global_batch is None:
            count = self.micro_batches or 1
            if problems:
                raise InvalidLayoutError(problems)
            return micro, count, per_step * count
        if self.global_batch % per_step:
            problems.append(
                Problem(
                    "global_batch",
                    f"global_batch({self.global_batch}) is not a multiple of micro_batch({micro})*data({data})={per_step}",
                )
            )
        count = max(self.global_batch // per_step, 1)
        if count > MAX_MICRO_BATCHES:
            problems.append(
                Problem(
                    "global_batch",
                    f"global_batch({self.global_batch}) / (micro_batch({micro})*data({data})) = {count} micro-batches "
                    f"per replica per step, more than {MAX_MICRO_BATCHES}",
                )
            )
        if self.micro_batches is not None and self.micro_batches * per_step != self.global_batch:
            problems.append(
                Problem(
                    "global_batch",
                    f"global_batch({self.global_batch}) != micro_batch({micro})*micro_batches({self.micro_batches})"
                    f"*data({data})={self.micro_batches * per_step}",
                )
            )
        if problems:
            raise InvalidLayoutError(problems)
        return micro, count, self.global_batch

    # --- engines ---------------------------------------------------------------------------------

    def to_torchtitan(self, *, layers: int | None = None) -> str:
        """A torchtitan job config (TOML); `layers` writes the layers per stage interleaving needs."""
        from stratagem.interop.torchtitan import layout_to_torchtitan

        return layout_to_torchtitan(self, layers=layers)

    def to_deepspeed(self) -> dict[str, Any]:
        """A DeepSpeed config (`ds_config` dict)."""
        from stratagem.interop.deepspeed import layout_to_deepspeed

        return layout_to_deepspeed(self)

    def to_megatron(self, *, layers: int | None = None) -> list[str]:
        """Megatron-LM command-line arguments."""
        from stratagem.interop.megatron import layout_to_megatron

        return layout_to_megatron(self, layers=layers)

    def to_accelerate(self, *, machines: int | None = None) -> str:
        """An Accelerate config (YAML)."""
        from stratagem.interop.accelerate import layout_to_accelerate

        return layout_to_accelerate(self, machines=machines)

    @classmethod
    def from_torchtitan(cls, toml_text: str) -> Layout:
        from stratagem.interop.torchtitan import layout_from_torchtitan

        return layout_from_torchtitan(toml_text)

    @classmethod
    def from_deepspeed(cls, config: str | dict[str, Any]) -> Layout:
        from stratagem.interop.deepspeed import layout_from_deepspeed

        return layout_from_deepspeed(config)

    @classmethod
    def from_megatron(cls, args: str | list[str]) -> Layout:
        from stratagem.interop.megatron import layout_from_megatron

        return layout_from_megatron(args)

    @classmethod
    def from_accelerate(cls, yaml_text: str) -> Layout:
        from stratagem.interop.accelerate import layout_from_accelerate

        return layout_from_accelerate(yaml_text)


def layout_problems(layout: Layout) -> list[Problem]:
    """Rules a layout must satisfy on its own, before a graph or a cluster is known."""
    problems: list[Problem] = []
    if layout.schedule == "interleaved-1f1b" and layout.virtual_stages < 2:
        problems.append(Problem("virtual_stages", "interleaved-1f1b needs at least 2 chunks per pipeline rank"))
    if layout.schedule in ("gpipe", "1f1b") and layout.virtual_stages != 1:
        problems.append(
            Problem("virtual_stages", f"{layout.schedule} runs one chunk per rank, not {layout.virtual_stages}")
        )
    if layout.pipeline == 1 and (layout.virtual_stages > 1 or layout.schedule in ("interleaved-1f1b", "zero-bubble")):
        problems.append(Problem("schedule", f"{layout.schedule} needs pipeline > 1 (pipeline is 1)"))
    if layout.sequence_parallel and layout.tensor in (1, None):
        problems.append(Problem("sequence_parallel", f"needs tensor > 1 (tensor is {layout.tensor or 1})"))
    if layout.async_tensor_parallel and not layout.sequence_parallel:
        problems.append(
            Problem(
                "async_tensor_parallel",
                "needs sequence_parallel: it overlaps the collectives sequence parallelism makes",
            )
        )
    if layout.fp8_all_gather and (layout.precision != "fp8" or layout.zero != 3):
        problems.append(
            Problem(
                "fp8_all_gather",
                f"needs precision fp8 and zero 3 (precision is {layout.precision}, zero is {layout.zero})",
            )
        )
    if layout.shard_group is not None:
        if layout.zero == 0:
            problems.append(Problem("shard_group", "hybrid sharding needs zero >= 1 (zero is 0)"))
        elif layout.data is not None and layout.data % layout.shard_group:
            problems.append(
                Problem("shard_group", f"shard_group({layout.shard_group}) does not divide data({layout.data})")
            )
    if layout.bucket_mb is not None and layout.zero != 0:
        problems.append(
            Problem("bucket_mb", f"sets DDP's all-reduce buckets, which zero 0 has (zero is {layout.zero})")
        )
    if layout.bucket_mb is not None and not layout.overlap_grad_reduce:
        problems.append(Problem("bucket_mb", "DDP's buckets overlap backward; overlap_grad_reduce is false"))
    if not layout.overlap_grad_reduce and layout.zero == 3:
        problems.append(
            Problem("overlap_grad_reduce", "zero 3 gathers and reduce-scatters unit by unit during compute")
        )
    if layout.global_batch is not None and layout.micro_batch is not None and layout.data is not None:
        per_step = layout.micro_batch * layout.data
        if layout.global_batch % per_step:
            problems.append(
                Problem(
                    "global_batch",
                    f"global_batch({layout.global_batch}) is not a multiple of "
                    f"micro_batch({layout.micro_batch})*data({layout.data})={per_step}",
                )
            )
    return problems


def layout_of(strategy: Strategy, graph: ModelGraph | None = None) -> Layout:
    """A strategy's layout, where it has one: every variable all-reduced uncompressed, or every one
    sharded at one stage; BSP; no partitions. The batch sizes need the graph (one micro-batch for a
    strategy that states its micro-batch size, a replica's step for others: `Strategy.step_samples`); without it the
    layout keeps the micro-batch count and leaves the batch sizes unset."""
    if graph is not None and strategy.graph_id is not None and strategy.graph_id != graph.id:
        raise UnsupportedStrategyError(
            f"the strategy was made for graph {strategy.graph_id[:12]}, not {str(graph.id)[:12]}"
        )
    zero, shard_group = _zero_of(strategy)
    mesh: Mesh = strategy.effective_mesh
    pipe = strategy.pipeline
    micro_batches = pipe.micro_batches if pipe is not None else 1
    batch: dict[str, Any] = {"micro_batches": micro_batches}
    if graph is not None:
        step = strategy.step_samples(graph.batch_size)
        if step % micro_batches:
            raise UnsupportedStrategyError(
                f"the graph's batch {step} does not split into {micro_batches} equal micro-batches"
            )
        batch = {"micro_batch": step // micro_batches, "global_batch": step * mesh.data, "micro_batches": None}
    return Layout(
        data=mesh.data,
        tensor=mesh.tensor,
        pipeline=mesh.pipeline,
        context=mesh.context,
        **batch,
        schedule=pipe.schedule if pipe is not None else "1f1b",
        virtual_stages=pipe.virtual_stages if pipe is not None else 1,
        zero=zero,
        shard_group=shard_group,
        recompute=strategy.recompute,
        precision=strategy.precision,
        sequence_parallel=strategy.sequence_parallel,
        async_tensor_parallel=strategy.async_tensor_parallel,
        fp8_all_gather=strategy.fp8_all_gather,
        compile=strategy.compile,
        **_reduction_of(strategy, graph, zero),
    )


def _reduction_of(strategy: Strategy, graph: ModelGraph | None, zero: ZeroLevel) -> dict[str, Any]:
    """`overlap_grad_reduce` as the strategy states it, and with the graph, the DDP bucket cap its
    all-reduce groups make."""
    if not strategy.overlap_grad_reduce:
        return {"overlap_grad_reduce": False}
    if graph is None or zero != 0:
        return {}
    group = {
        config.var_name: config.synchronizer.group
        for config in strategy.variables
        if isinstance(config.synchronizer, AllReduceSynchronizer)
    }
    return {"bucket_mb": _bucket_of(graph, [group.get(variable.name) for variable in graph.trainable_variables])}


def _bucket_groups(graph: ModelGraph, bucket_mb: int | None) -> list[int]:
    from stratagem.layout_build import DDP_BUCKET_MB, ddp_groups

    return ddp_groups(graph, bucket_mb or DDP_BUCKET_MB)


def _bucket_of(graph: ModelGraph, groups: list[int | None]) -> int | None:
    """The DDP bucket cap (MiB) whose buckets are these all-reduce groups: None for DDP's own 25 MiB or
    for groups no cap makes. A bucket that closed holds at least the cap and less than the cap plus its
    last gradient; the last bucket may instead have stayed open, below the cap. So the smallest cap above
    every bucket's bytes less its last gradient makes the groups if any cap does, or else the smallest
    above the last bucket's bytes."""
    from stratagem.layout_build import MIB

    if groups == _bucket_groups(graph, None):
        return None
    sizes: dict[int | None, int] = {}
    last: dict[int | None, int] = {}
    for variable, number in zip(graph.trainable_variables, groups, strict=True):
        sizes[number] = sizes.get(number, 0) + variable.nbytes
        last.setdefault(number, variable.nbytes)
    later = [number for number in sizes if number not in (0, None)]
    if not later:
        return None
    closed = max(sizes[n] - last[n] for n in later) // MIB + 1
    open_tail = max(closed, sizes[max(later)] // MIB + 1)
    return next((cap for cap in (closed, open_tail) if _bucket_groups(graph, cap) == groups), None)


def _zero_of(strategy: Strategy) -> tuple[ZeroLevel, int | None]:
    """The ZeRO level and shard group every variable agrees on, or why there is none."""
    reasons = []
    if strategy.consistency.kind != "bsp":
        reasons.append(f"{strategy.consistency.kind} consistency (a layout trains in lockstep)")
    kinds: set[tuple[ZeroLevel, int | None]] = set()
    for config in strategy.variables:
        if config.partition is not None:
            reasons.append(f"variable {config.var_name!r} is partitioned into {config.partition.shards} shards")
        for sync in config.synchronizers:
            if isinstance(sync, AllReduceSynchronizer):
                if sync.compressor.kind != "none":
                    reasons.append(
                        f"variable {config.var_name!r} is all-reduced with {sync.compressor.kind} compression"
                    )
                kinds.add((0, None))
            elif isinstance(sync, ShardedSynchronizer):
                kinds.add((sync.stage, sync.shard_group))
            else:
                reasons.append(f"variable {config.var_name!r} is on a parameter server ({sync.reduction_destination})")
    if len(kinds) > 1:
        shown = ", ".join(
            f"zero {stage}" + (f" in groups of {group}" if group else "") for stage, group in sorted(kinds)
        )
        reasons.append(f"variables are synchronized differently ({shown}); a layout has one ZeRO level")
    if reasons:
        more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
        raise UnsupportedStrategyError("no layout states this strategy: " + "; ".join(reasons[:3]) + more)
    return next(iter(kinds)) if kinds else (0, None)


def node_count(strategy: Strategy) -> int:
    """Machines the strategy's replicas sit on."""
    return len({device_address(device) for device in strategy.replicas})
