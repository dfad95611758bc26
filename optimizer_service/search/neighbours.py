"""One-dimension changes of a row's layout: what the descent walks and what the explanation compares.

A row's layout is its `MeshChoice` (degrees, micro-batches, schedule, recomputation, sequence
parallelism, precision, compile, async tensor parallelism) and its ZeRO setting (`Zero`: how the dense
variables synchronize, and whether ZeRO-3 gathers fp8 weights in fp8). A neighbour changes one
dimension and keeps everything else, every variable's synchronizer included, where the rules allow
(`dimensions.Rules`): a degree trades with the data degree (or tensor with pipeline: the model split); a
micro-batch size moves to the next divisor of the replica's step; the schedule, the recomputation,
sequence parallelism, async tensor parallelism, compile, the precision, the ZeRO stage, the hybrid shard
group and fp8 all-gathers take each other legal value. What a change forces is repaired the way a
practitioner would: under a global batch the micro-batch size shrinks to a divisor of the new step, a
schedule the new micro-batch count cannot run falls back to 1F1B, stages are re-cut balanced by compute,
async tensor parallelism goes where sequence parallelism or compile goes, fp8 all-gathers where fp8 or
ZeRO-3 goes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from optimizer_service.search.assign import set_allreduce, set_fusion, set_mesh, set_sharded, set_zero
from optimizer_service.search.dimensions import divisors
from optimizer_service.search.meshes import (
    PRECISION_LABELS,
    SCHEDULE_NAMES,
    MeshChoice,
    pipeline_micro_batches,
    recompute_flags,
)
from optimizer_service.search.space import Space
from simulator.encoding import CandidateBatch, Precision, Schedule, SyncKind

FUSION_BYTES = 25 * 1024 * 1024
"""Bucket cap of dense variables a ZeRO change regroups (DDP's and FSDP's default)."""


@dataclass(frozen=True)
class Zero:
    """How a row's dense variables synchronize: stage 0, all-reduced; 1-3, ZeRO-sharded at that stage
    over groups of `shard_group` data ranks (0: the whole data-parallel group); `mixed`, only some of them
    sharded (the rest all-reduced or on parameter servers: a per-variable mix); `fp8_gather`, ZeRO-3
    gathering the fp8 Linears' weights in fp8 (torchao's `enable_fsdp_float8_all_gather`)."""

    stage: int
    shard_group: int = 0
    mixed: bool = False
    sharded: int = field(default=0, compare=False)
    """Dense variables sharded (for the words of a mix)."""
    dense: int = field(default=0, compare=False)
    fp8_gather: bool = False

    def words(self) -> str:
        if self.stage == 0:
            return "all-reduced gradients"
        group = f" in groups of {self.shard_group}" if self.shard_group else ""
        name = "FSDP (ZeRO-3)" if self.stage == 3 else f"ZeRO-{self.stage}"
        part = f" for {self.sharded} of {self.dense} dense variables" if self.mixed and self.dense else ""
        gather = " with fp8 all-gathers" if self.fp8_gather else ""
        return f"{name}{group}{part}{gather}"


@dataclass(frozen=True)
class Change:
    """One neighbour: the dimension it changes and the row it becomes (a layout or a ZeRO setting)."""

    dimension: str
    mesh: MeshChoice | None = None
    zero: Zero | None = None


def mesh_of_row(space: Space, batch: CandidateBatch, i: int) -> MeshChoice:
    found = MeshChoice(
        data=int(batch.data[i]),
        tensor=int(batch.tensor[i]),
        pipeline=int(batch.pipeline[i]),
        micro_batches=int(batch.micro_batches[i]),
        schedule=Schedule(int(batch.schedule[i])),
        layer_stage=tuple(batch.layer_stage[i].tolist()) if int(batch.pipeline[i]) > 1 else (),
        recompute=bool(batch.recompute[i]),
        context=int(batch.context_parallel[i]),
        virtual_stages=int(batch.virtual_stages[i]),
        selective=bool(batch.selective[i]),
        sequence_parallel=bool(batch.sequence_parallel[i]),
        micro_batch_size=int(batch.micro_batch_size[i]),
        precision=int(batch.precision[i]),
        selective_op=bool(batch.selective_op[i]),
        compile=bool(batch.compile[i]),
        async_tp=bool(batch.async_tp[i]),
    )
    index = space.mesh_index.get(found)
    return space.meshes[index] if index is not None else found


def zero_of_row(space: Space, batch: CandidateBatch, i: int) -> Zero:
    dense = ~space.context.var_sparse
    sharded = batch.kind[i][dense] == SyncKind.SHARDED
    if not sharded.any():
        return Zero(0)
    stage = int(np.bincount(batch.zero_stage[i][dense][sharded]).argmax())
    mixed = not bool(sharded.all())
    return Zero(
        stage,
        int(batch.shard_group[i]),
        mixed,
        sharded=int(sharded.sum()),
        dense=len(sharded),
        fp8_gather=stage == 3 and bool(batch.fp8_gather[i]),
    )


DIMENSIONS = (
    "tensor",
    "pipeline",
    "context",
    "model split",
    "context split",
    "micro-batch",
    "schedule",
    "recompute",
    "sequence parallel",
    "async tensor parallel",
    "compile",
    "precision",
    "zero",
    "fp8 all-gather",
)
ZERO_DIMENSIONS = {"zero": ("zero", "sharded variables", "shard group"), "fp8 all-gather": ("fp8 all-gather",)}
"""The dimensions of the ZeRO setting, by the name a move draws (`zero` covers which dense variables are
sharded and the shard group too)."""


def changes(space: Space, batch: CandidateBatch, i: int, only: str | None = None) -> list[Change]:
    """Every one-dimension neighbour of row i (of dimension `only`, where given; `zero` covers the shard
    group too)."""
    mesh = mesh_of_row(space, batch, i)
    out = [Change(dimension, mesh=m) for dimension, m in layout_neighbours(space, mesh, only)]
    if only is None or only in ZERO_DIMENSIONS:
        zero = zero_of_row(space, batch, i)
        out += [
            Change(dimension, zero=z)
            for dimension, z in zero_neighbours(space, mesh, zero)
            if only is None or dimension in ZERO_DIMENSIONS[only]
        ]
    return out


def neighbour_rows(space: Space, batch: CandidateBatch, i: int) -> tuple[CandidateBatch, list[Change]]:
    """Copies of row i, one per neighbour, each with its change applied."""
    found = changes(space, batch, i)
    rows = batch.take(np.full(len(found), i, dtype=np.intp))
    for r, change in enumerate(found):
        apply(space, rows, np.array([r]), change)
    return rows, found


def apply(space: Space, batch: CandidateBatch, rows: np.ndarray, change: Change) -> None:
    if change.mesh is not None:
        set_mesh(space, batch, rows, space.register(change.mesh))
    elif change.zero is not None:
        write_zero(space, batch, rows, change.zero)


def write_zero(space: Space, batch: CandidateBatch, rows: np.ndarray, zero: Zero) -> None:
    dense = ~space.context.var_sparse
    batch.fp8_gather[rows] = zero.fp8_gather
    if zero.stage == 0:
        set_allreduce(batch, rows, dense)
        set_fusion(space, batch, rows, FUSION_BYTES)
        batch.shard_group[rows] = 0
        return
    if not zero.mixed and not (batch.kind[rows][:, dense] == SyncKind.SHARDED).all():
        set_sharded(batch, rows, dense)
        set_fusion(space, batch, rows, FUSION_BYTES)
    set_zero(batch, rows, zero.stage, zero.shard_group)


# --- the layout's neighbours -----------------------------------------------------------------------


def layout_neighbours(space: Space, mesh: MeshChoice, only: str | None = None) -> list[tuple[str, MeshChoice]]:
    rules = space.rules
    out: list[tuple[str, MeshChoice | None]] = []
    t, p, c = mesh.tensor, mesh.pipeline, mesh.context

    def wanted(dimension: str) -> bool:
        return only is None or only == dimension

    if wanted("tensor"):
        out += [("tensor", _degrees(space, mesh, tensor=other)) for other in _adjacent(list(rules.tensor), t)]
    if wanted("pipeline"):
        depths = [q for q in divisors(rules.devices // (t * c)) if q <= rules.max_pipeline(t, c)]
        out += [("pipeline", _degrees(space, mesh, pipeline=other)) for other in _adjacent(depths, p)]
    if wanted("context"):
        out += [("context", _degrees(space, mesh, context=other)) for other in _adjacent(list(rules.context), c)]
    if wanted("model split"):
        for other in _adjacent(list(rules.tensor), t):
            if (p * t) % other == 0:
                out.append(("model split", _degrees(space, mesh, tensor=other, pipeline=p * t // other)))
    if wanted("context split"):
        out += [("context split", m) for m in _context_trades(space, mesh)]
    if wanted("micro-batch"):
        out += [("micro-batch", m) for m in _micro_neighbours(space, mesh)]
    if wanted("schedule"):
        for schedule, virtual in rules.schedules(p, mesh.micro_batches):
            if (schedule, virtual) != (mesh.schedule, mesh.virtual_stages):
                out.append(("schedule", complete(space, mesh, schedule=schedule, virtual_stages=virtual)))
    if wanted("recompute"):
        for mode in rules.recompute_modes(p):
            if mode != mesh.recompute_mode:
                out.append(("recompute", complete(space, mesh, **recompute_flags(mode))))
    if wanted("sequence parallel") and t > 1 and rules.sequence_parallel:
        out.append(("sequence parallel", complete(space, mesh, sequence_parallel=not mesh.sequence_parallel)))
    if wanted("async tensor parallel") and rules.async_tp_ok(
        t, sequence_parallel=mesh.sequence_parallel, compile=mesh.compile
    ):
        out.append(("async tensor parallel", complete(space, mesh, async_tp=not mesh.async_tp)))
    if wanted("compile"):
        out += [("compile", complete(space, mesh, compile=other)) for other in rules.compiles if other != mesh.compile]
    if wanted("precision"):
        for precision in rules.precisions:
            if precision != mesh.precision and rules.precision_ok(precision, t):
                out.append(("precision", complete(space, mesh, precision=precision)))
    return [(dimension, m) for dimension, m in out if m is not None and m != mesh]


def zero_neighbours(space: Space, mesh: MeshChoice, zero: Zero) -> list[tuple[str, Zero]]:
    """Each other ZeRO stage (fp8 all-gathers kept only at stage 3), the shard groups, and fp8 all-gathers
    switched at ZeRO-3 where the rules allow them."""
    if not (~space.context.var_sparse).any():
        return []
    if zero.stage == 0:
        return [("zero", Zero(stage)) for stage in (1, 2, 3)]
    groups = [0, *space.rules.shard_groups(mesh.data, mesh.tensor, mesh.pipeline, mesh.context)]
    out = [("zero", replace(zero, stage=stage, fp8_gather=False)) for stage in (1, 2, 3) if stage != zero.stage]
    out.append(("zero", Zero(0)))
    if zero.mixed:
        out.append(("sharded variables", Zero(zero.stage, zero.shard_group, fp8_gather=zero.fp8_gather)))
    out += [("shard group", replace(zero, shard_group=g)) for g in groups if g != zero.shard_group]
    if zero.stage == 3 and space.rules.fp8_gather_ok(mesh.precision):
        out.append(("fp8 all-gather", replace(zero, fp8_gather=not zero.fp8_gather)))
    return out


def complete(space: Space, mesh: MeshChoice, **changes: Any) -> MeshChoice | None:
    """`mesh` with `changes`, repaired to the rules: micro-batches, schedule, recomputation, sequence
    parallelism, async tensor parallelism, precision and compile kept where still legal, stages re-cut
    where the split changed; None where no legal layout has these degrees."""
    want = replace(mesh, **changes)
    rules = space.rules
    t, p, c = want.tensor, want.pipeline, want.context
    if t not in rules.tensor or c not in rules.context or p > rules.max_pipeline(t, c):
        return None
    if t * p * c * want.data != rules.devices or want.data < 1:
        return None
    micro = _micro(space, want)
    if micro is None:
        return None
    size, count = micro
    schedules = rules.schedules(p, count)
    schedule, virtual = (
        (want.schedule, want.virtual_stages) if (want.schedule, want.virtual_stages) in schedules else schedules[0]
    )
    mode = want.recompute_mode if want.recompute_mode in rules.recompute_modes(p) else "none"
    precision = want.precision if rules.precision_ok(want.precision, t) else rules.precisions[0]
    compile = want.compile if want.compile in rules.compiles else rules.compiles[0]
    sequence = want.sequence_parallel and t > 1 and rules.sequence_parallel
    same_cut = (t, p, virtual) == (mesh.tensor, mesh.pipeline, mesh.virtual_stages)
    stage = mesh.layer_stage if same_cut else space.cuts.balanced(t, p * virtual)
    return MeshChoice(
        data=want.data,
        tensor=t,
        pipeline=p,
        micro_batches=count,
        schedule=schedule,
        layer_stage=stage if p > 1 else (),
        split=(mesh.split if same_cut else "compute") if p > 1 else "",
        context=c,
        virtual_stages=virtual,
        sequence_parallel=sequence,
        micro_batch_size=size,
        precision=precision,
        compile=compile,
        async_tp=want.async_tp and rules.async_tp_ok(t, sequence_parallel=sequence, compile=compile),
        **recompute_flags(mode),
    )


def _degrees(space: Space, mesh: MeshChoice, **degrees: int) -> MeshChoice | None:
    """New degrees; the data degree takes what they leave."""
    t = degrees.get("tensor", mesh.tensor)
    p = degrees.get("pipeline", mesh.pipeline)
    c = degrees.get("context", mesh.context)
    rest = space.rules.devices // (t * p * c)
    if rest < 1 or rest * t * p * c != space.rules.devices:
        return None
    return complete(space, mesh, data=rest, tensor=t, pipeline=p, context=c)


def _context_trades(space: Space, mesh: MeshChoice) -> list[MeshChoice | None]:
    """The next context degree paid for by the tensor or pipeline degree, the data degree kept (with one
    replica, the only way to split a long sequence further)."""
    out = []
    t, p, c = mesh.tensor, mesh.pipeline, mesh.context
    for other in _adjacent(list(space.rules.context), c):
        if other > c and other % c == 0:
            factor = other // c
            if t % factor == 0:
                out.append(_degrees(space, mesh, context=other, tensor=t // factor))
            if p % factor == 0:
                out.append(_degrees(space, mesh, context=other, pipeline=p // factor))
        elif other < c and c % other == 0:
            factor = c // other
            out.append(_degrees(space, mesh, context=other, tensor=t * factor))
            out.append(_degrees(space, mesh, context=other, pipeline=p * factor))
    return out


def _micro(space: Space, mesh: MeshChoice) -> tuple[int, int] | None:
    """(micro-batch size, micro-batches) for the layout: under a global batch the size is kept where it
    divides the replica's step, else the largest divisor below it; without one the count is kept where
    the pipeline (or accumulation) takes it, else the nearest count it takes."""
    rules = space.rules
    p = mesh.pipeline
    if rules.global_batch is not None:
        if rules.global_batch % mesh.data:
            return None
        step = rules.global_batch // mesh.data
        if p == 1 and not rules.accumulate:
            return step, 1
        size = max([d for d in divisors(step) if d <= max(mesh.micro_batch_size, 1)], default=1)
        return size, step // size
    if p > 1:
        counts = pipeline_micro_batches(rules.graph_batch, p)
        wanted = mesh.micro_batches
        return 0, wanted if wanted in counts else min(counts, key=lambda m: (abs(np.log(m / wanted)), m))
    if rules.accumulate and rules.graph_batch % mesh.micro_batches == 0:
        return 0, mesh.micro_batches
    return 0, 1


def _micro_neighbours(space: Space, mesh: MeshChoice) -> list[MeshChoice | None]:
    rules = space.rules
    p = mesh.pipeline
    if rules.global_batch is not None:
        step = rules.global_batch // mesh.data
        if p == 1 and not rules.accumulate:
            return []
        sizes = _adjacent(divisors(step), mesh.micro_batch_size)
        return [complete(space, mesh, micro_batch_size=s, micro_batches=step // s) for s in sizes]
    counts = pipeline_micro_batches(rules.graph_batch, p) if p > 1 else divisors(rules.graph_batch)
    if p == 1 and not rules.accumulate:
        return []
    return [complete(space, mesh, micro_batches=m) for m in _adjacent(counts, mesh.micro_batches)]


def _adjacent(values: list[int], current: int) -> list[int]:
    """The values just below and just above `current` in sorted `values`."""
    ordered = sorted(set(values))
    below = [v for v in ordered if v < current]
    above = [v for v in ordered if v > current]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


# --- words ---------------------------------------------------------------------------------------


DIMENSION_WORDS = {
    "tensor": "the tensor degree",
    "pipeline": "the pipeline depth",
    "context": "the context degree",
    "model split": "the tensor × pipeline split",
    "context split": "the context degree (traded with tensor or pipeline)",
    "micro-batch": "the micro-batch size",
    "schedule": "the pipeline schedule",
    "recompute": "recomputation",
    "sequence parallel": "sequence parallelism",
    "async tensor parallel": "async tensor parallelism",
    "compile": "compiling the blocks",
    "precision": "the precision",
    "zero": "the ZeRO stage",
    "sharded variables": "which dense variables are ZeRO-sharded",
    "shard group": "the hybrid shard group",
    "fp8 all-gather": "gathering fp8 weights in fp8",
}


RECOMPUTE_WORDS = {
    "none": "no recomputation",
    "selective": "selective recomputation",
    "selective-op": "per-op checkpointing",
    "full": "full recomputation",
}


def dimension_words(dimension: str) -> str:
    return DIMENSION_WORDS.get(dimension, dimension)


def value_words(dimension: str, mesh: MeshChoice, zero: Zero) -> str:
    """The value a layout takes in one dimension, in words."""
    if dimension == "tensor":
        return f"tensor {mesh.tensor} (data {mesh.data})"
    if dimension == "pipeline":
        return f"{mesh.pipeline} pipeline stages (data {mesh.data})"
    if dimension == "context":
        return f"context {mesh.context} (data {mesh.data})"
    if dimension == "model split":
        return f"tensor {mesh.tensor} × pipeline {mesh.pipeline}"
    if dimension == "context split":
        return f"context {mesh.context} × tensor {mesh.tensor} × pipeline {mesh.pipeline}"
    if dimension == "micro-batch":
        if mesh.micro_batch_size:
            return f"micro-batches of {mesh.micro_batch_size} ({mesh.micro_batches} per step)"
        return f"{mesh.micro_batches} micro-batches per step"
    if dimension == "schedule":
        chunks = f" with {mesh.virtual_stages} chunks per rank" if mesh.virtual_stages > 1 else ""
        return f"the {SCHEDULE_NAMES[Schedule(mesh.schedule)]} schedule{chunks}"
    if dimension == "recompute":
        return RECOMPUTE_WORDS[mesh.recompute_mode]
    if dimension == "sequence parallel":
        return "sequence parallelism" if mesh.sequence_parallel else "no sequence parallelism"
    if dimension == "async tensor parallel":
        return "async tensor parallelism" if mesh.async_tp else "tensor-parallel collectives after their matmuls"
    if dimension == "compile":
        return "compiled blocks" if mesh.compile else "eager blocks"
    if dimension == "precision":
        return PRECISION_LABELS[Precision(mesh.precision)]
    if dimension == "fp8 all-gather":
        return "fp8 all-gathers" if zero.fp8_gather else "bf16 all-gathers"
    if dimension == "sharded variables":
        return (
            f"{zero.sharded} of {zero.dense} dense variables sharded" if zero.mixed else "every dense variable sharded"
        )
    return zero.words()
