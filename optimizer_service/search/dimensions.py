"""Which values each layout dimension may take for one graph, cluster and set of options.

The dimensions a GPU team configures (Megatron-LM's and torchtitan's flags): tensor, pipeline, context
and data degrees, micro-batch size, pipeline schedule and virtual stages, activation recomputation,
sequence parallelism, ZeRO stage and hybrid shard group, precision, and the three knobs torchtitan adds:
`torch.compile` of the blocks, async tensor parallelism and fp8 FSDP all-gathers. Who runs the answer
decides what is legal (`SearchOptions.runner`):

- `stratagem` — `stratagem.distribute` (the trials run it): the rules of `stratagem.parallel_rules`. A
  model that returns its own loss is cut between its blocks into traced stages that hold no tensor
  splits, no recomputation and no multi-chunk schedule; a model it cannot cut gets no pipeline; it runs
  context parallelism on Hugging Face models and the zoo's transformers, without pipeline stages
  (`stratagem.parallel_rules.context_parallel_refusal`), no fp8 with
  tensor parallelism (`stratagem.runtime.precision.precision_refusal`) and no async tensor parallelism
  (`async_tensor_parallel_refusal`); it compiles blocks (`stratagem.runtime.compile`) and checkpoints per
  op, except in a Hugging Face model, whose blocks fill their KV cache in forward so that the replay in
  backward differs from it (per-op checkpointing refuses that).
- `engine` — the LLM trainers a strategy exports to (torchtitan, Megatron-LM): every layout of the
  model's blocks, the checks `Layout.build` makes (`stratagem.layout_build.graph_problems`), and async
  tensor parallelism on GPUs (torchtitan's `enable_async_tensor_parallel`, which needs compiled blocks).

Either way: a tensor degree divides a node's devices and the attention (and key/value) heads, and the
runtime's tensor plan splits every layer the simulator prices as split; context parallelism needs a
transformer with an architecture on record and a sequence that splits into 2·c pieces (blockwise
attention balances causal work over 2·c chunks, Megatron's, torchtitan's and the runtime's load
balancing; the runtime keeps them for a non-causal model too); sequence parallelism needs tensor > 1 and attention layers (norms and dropout along
the sequence); selective recomputation needs attention cores inside the numbered blocks, per-op
checkpointing (`selective-op`, torchtitan's) is offered beside it where it drops something, full
recomputation needs numbered blocks; precision is the request's unless `allow_precision`, fp8 only
on devices with fp8 tensor cores and fp16 (an fp16 model beside fp32 master weights, which the runtime
does not keep) only for the `engine` runner; compile is the request's unless `allow_compile`; async tensor
parallelism needs tensor > 1, sequence parallelism and compile; fp8 all-gathers need fp8 and ZeRO-3;
a hybrid shard group stays inside one node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.codec import PRECISION_CODES
from simulator.context import SimContext
from simulator.encoding import Precision, Schedule
from stratagem.architecture import architecture_of
from stratagem.parallel_rules import (
    Refusal,
    block_of,
    graph_accumulation_refusal,
    graph_context_parallel_refusal,
    graph_pipeline_route,
)
from stratagem.tensor_plan import Split, candidate_splits, covered_layers

MAX_STAGES = 64
"""Deepest pipeline tried (the encoding's int8 `layer_stage` holds 127; Megatron's 1T model used 64)."""
MAX_CONTEXT = 32
"""Largest context degree tried (torchtitan's published long-context runs go to 8 on one node)."""
VIRTUAL_STAGES = (2, 4)
"""Chunks per rank tried with interleaved 1F1B (Megatron's SC'21 runs used 2 to 4)."""
ZERO_BUBBLE_STAGES = (1, 2)
"""Zero-bubble: ZB-H1 (one chunk per rank) and the V-shaped ZBV (two)."""
RECOMPUTE = ("none", "selective", "selective-op", "full")
PRECISION_NAMES = PRECISION_CODES
RUNNERS = ("stratagem", "engine")


@dataclass(frozen=True)
class Rules:
    """The legal values of every layout dimension (see the module docstring)."""

    runner: str
    devices: int
    per_node: int
    tensor: tuple[int, ...]
    """Tensor degrees, 1 first."""
    context: tuple[int, ...]
    """Context degrees, 1 first."""
    pipeline_context: bool
    """Context parallelism inside pipeline stages."""
    starts: tuple[int, ...]
    """Layers where a pipeline stage may begin (the first layer first); one entry: no pipeline."""
    pipeline_tensor: bool
    """Tensor splits inside pipeline stages."""
    pipeline_recompute: bool
    """Recomputation inside pipeline stages."""
    multi_chunk: bool
    """Interleaved 1F1B and zero-bubble schedules."""
    recompute: tuple[str, ...]
    """Recomputation modes this graph has a use for and the runner runs ('none' first)."""
    sequence_parallel: bool
    """Offered with tensor > 1."""
    precisions: tuple[int, ...]
    """`Precision` values, the request's first; more only with `allow_precision`."""
    fp8_tensor: bool
    """fp8 with tensor > 1."""
    compiles: tuple[bool, ...]
    """`torch.compile` of the blocks, the request's first; both only with `allow_compile`."""
    async_tp: bool
    """Async tensor parallelism (with tensor > 1, sequence parallelism and compile)."""
    fp8_gather: bool
    """fp8 FSDP all-gathers (with fp8 precision and ZeRO-3)."""
    accumulate: bool
    """Micro-batches without a pipeline (gradient accumulation)."""
    global_batch: int | None
    """Samples per optimizer step over all replicas, fixed by the request; None: the graph's batch is a
    replica's step."""
    graph_batch: int
    notes: tuple[str, ...] = ()
    """Why a dimension offers nothing here, in words for the space report."""

    @property
    def deepest(self) -> int:
        return min(len(self.starts), MAX_STAGES)

    def max_pipeline(self, tensor: int, context: int = 1) -> int:
        """Most stages for a tensor and context degree (1 where stages cannot hold tensor splits, or
        context parallelism where the runner does not run it beside stages)."""
        if (tensor > 1 and not self.pipeline_tensor) or (context > 1 and not self.pipeline_context):
            return 1
        return self.deepest

    def recompute_modes(self, pipeline: int) -> tuple[str, ...]:
        return self.recompute if pipeline == 1 or self.pipeline_recompute else ("none",)

    def schedules(self, pipeline: int, micro_batches: int) -> list[tuple[Schedule, int]]:
        """(schedule, virtual stages) for `pipeline` stages and `micro_batches` per step: 1F1B needs
        m >= p (GPipe otherwise); interleaving needs m a multiple of p (Megatron's rule) and a block for
        every chunk; zero-bubble runs one or two chunks per rank."""
        if pipeline == 1:
            return [(Schedule.ONE_F_ONE_B, 1)]
        out = [(Schedule.ONE_F_ONE_B, 1) if micro_batches >= pipeline else (Schedule.GPIPE, 1)]
        if micro_batches >= pipeline:
            out.append((Schedule.GPIPE, 1))
        if self.multi_chunk and micro_batches >= pipeline:
            room = self.deepest
            if micro_batches % pipeline == 0:
                out += [(Schedule.INTERLEAVED, v) for v in VIRTUAL_STAGES if pipeline * v <= room]
            out += [(Schedule.ZERO_BUBBLE, v) for v in ZERO_BUBBLE_STAGES if pipeline * v <= room]
        return out

    def shard_groups(self, data: int, tensor: int, pipeline: int, context: int) -> list[int]:
        """Hybrid shard groups of consecutive data ranks that stay inside one node (1 < g < data)."""
        stride = tensor * pipeline * context
        return [
            g
            for g in range(2, data)
            if data % g == 0 and g * stride <= self.per_node and self.per_node % (g * stride) == 0
        ]

    def precision_ok(self, precision: int, tensor: int) -> bool:
        return precision in self.precisions and (precision != Precision.FP8 or tensor == 1 or self.fp8_tensor)

    def async_tp_ok(self, tensor: int, *, sequence_parallel: bool, compile: bool) -> bool:
        """torchtitan pipelines sequence parallelism's collectives inside compiled blocks only."""
        return self.async_tp and tensor > 1 and sequence_parallel and compile

    def fp8_gather_ok(self, precision: int) -> bool:
        """Where a ZeRO-3 row may gather its fp8 weights in fp8 (the ZeRO stage is the row's own)."""
        return self.fp8_gather and precision == Precision.FP8


def rules_for(
    context: SimContext,
    *,
    runner: str = "stratagem",
    precision: int = Precision.FP32,
    allow_precision: bool = False,
    compile: bool = False,
    allow_compile: bool = False,
    global_batch: int | None = None,
) -> Rules:
    devices = len(context.compute_device_indices)
    per_node = devices_per_node(context)
    engine = runner == "engine"
    notes: list[str] = []
    route = graph_pipeline_route(context.graph)
    if engine:
        starts = block_starts(context) if context.layer_recomputed.any() else context.unit_starts
        pipeline_tensor = pipeline_recompute = multi_chunk = True
    elif isinstance(route, Refusal):
        starts, pipeline_tensor, pipeline_recompute, multi_chunk = np.zeros(1, dtype=np.int64), True, True, False
        notes.append(f"no pipeline stages: {route}")
    elif route == "blocks":
        starts, pipeline_tensor, pipeline_recompute, multi_chunk = block_starts(context), False, False, False
    else:
        starts, pipeline_tensor, pipeline_recompute, multi_chunk = context.unit_starts, True, True, True
    attention = bool(context.layer_attention.any())
    recompute = ["none"]
    if context.selective_dropped.any():
        recompute.append("selective")
        if context.op_recomputed.any():
            recompute.append("selective-op")
    if context.layer_recomputed.any():
        recompute.append("full")
    gpus = bool(context.kinds.is_gpu[context.device_kind[context.compute_device_indices]].all())
    precisions = _precisions(context, precision, allow_precision, engine=engine)
    accumulate = engine or graph_accumulation_refusal(context.graph) is None
    contexts = _context_degrees(context, devices)
    if not engine:
        refusal = graph_context_parallel_refusal(context.graph)
        if refusal is not None and len(contexts) > 1:
            contexts = (1,)
            notes.append(f"no context parallelism: {refusal}")
        if attention:
            notes.append(
                "no async tensor parallelism: stratagem's runtime does not run it (runner 'engine' exports it)"
            )
    return Rules(
        runner=runner,
        devices=devices,
        per_node=per_node,
        tensor=tuple(tensor_degrees(context, devices, per_node, engine=engine)),
        context=contexts,
        pipeline_context=engine,
        starts=tuple(int(s) for s in starts),
        pipeline_tensor=pipeline_tensor,
        pipeline_recompute=pipeline_recompute,
        multi_chunk=multi_chunk,
        recompute=tuple(recompute),
        sequence_parallel=attention,
        precisions=precisions,
        fp8_tensor=engine,
        compiles=(bool(compile), not compile) if allow_compile else (bool(compile),),
        async_tp=engine and gpus and attention,
        fp8_gather=Precision.FP8 in precisions,
        accumulate=accumulate,
        global_batch=global_batch,
        graph_batch=context.batch_size,
        notes=tuple(notes),
    )


def tensor_degrees(context: SimContext, devices: int, per_node: int, *, engine: bool = False) -> list[int]:
    """1, and each T > 1 that divides a node's devices and the attention and key/value heads, and that
    the runner splits: stratagem's runtime only where its plan (`stratagem.tensor_plan`) splits every
    layer the simulator splits at T; an engine (Megatron's and torchtitan's plans split every
    transformer's attention by heads, grouped-query included) wherever the architecture is on record."""
    arch = architecture_of(context.graph)
    heads = [arch.heads, arch.kv_heads or arch.heads] if arch is not None else []
    splits = candidate_splits(context.graph)
    if not splits and not (engine and arch is not None):
        return [1]

    def splits_all(t: int) -> bool:
        return (engine and arch is not None) or not uncovered(context, splits, t)

    return [
        t
        for t in divisors(per_node)
        if devices % t == 0 and (t == 1 or (splits_all(t) and all(h % t == 0 for h in heads)))
    ]


def uncovered(context: SimContext, splits: list[Split], tensor: int) -> list[str]:
    """Layers the simulator prices as split at degree `tensor` that the runtime's plan leaves whole."""
    covered = covered_layers(splits, tensor)
    return [name for i, name in enumerate(context.layer_names) if context.layer_tensor_split[i] and i not in covered]


def block_starts(context: SimContext) -> np.ndarray:
    """The first layer, and the first layer of each numbered block: where stages are cut between blocks
    (`parallel_rules.block_cuts`), so embeddings stay in the first stage and the head in the last."""
    names = context.layer_names
    blocks = [block_of(names[i]) for i in context.unit_starts]
    return np.array(
        [0] + [int(i) for i, block in zip(context.unit_starts, blocks, strict=True) if block is not None and i > 0],
        dtype=context.unit_starts.dtype,
    )


def _context_degrees(context: SimContext, devices: int) -> tuple[int, ...]:
    arch = architecture_of(context.graph)
    if arch is None or not context.layer_attention.any():
        return (1,)
    return tuple(c for c in divisors(devices) if c <= MAX_CONTEXT and arch.seq % (2 * c) == 0)


def _precisions(context: SimContext, precision: int, allow: bool, *, engine: bool) -> tuple[int, ...]:
    if not allow:
        return (int(precision),)
    kinds = context.device_kind[context.compute_device_indices]
    fp8 = bool(context.kinds.peaks.fp8[kinds].all())
    others = [
        int(p) for p in Precision if p != precision and (p != Precision.FP8 or fp8) and (p != Precision.FP16 or engine)
    ]
    return (int(precision), *others)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def devices_per_node(context: SimContext) -> int:
    counts = np.bincount(context.device_node[context.compute_device_indices], minlength=context.num_nodes)
    return int(counts[counts > 0].min()) if counts.any() else 1
