"""The mesh choices: data × tensor × pipeline × context factorizations, stage splits, micro-batches,
schedules, recomputation, sequence parallelism, precision, compile and async tensor parallelism —
everything of a layout but how the variables synchronize.

For G compute devices, N per node, under the legal values of `dimensions.Rules`:
- tensor degree T: divides N (a tensor group fills part of one node, never two: its all-reduces sit on
  the critical path), G and the attention heads, and the runtime's plan for T (`stratagem.tensor_plan`)
  splits every layer the simulator prices as split — so a CNN gets no tensor degree;
- pipeline degree P: divides G / T, at most the number of places the model can be cut (`Rules.starts`:
  between blocks, or between an nn.Sequential's children); data degree D = G / (T · P · C);
- stages: contiguous runs of units, cut where the forward + backward work reaches equal shares
  (balanced by compute); without a global batch, if a stage then exceeds the device memory, re-cut
  greedily under the memory cap (parameters, gradients and optimizer state of its layers, plus
  1F1B's activations in flight);
- micro-batches: without a global batch (the graph's batch is a replica's step), with a pipeline
  P, 2P, 4P, 8P and one sample each (m = batch), where they divide the per-replica batch (1F1B; GPipe
  with m = batch when the batch is smaller than P); without one, 1, and gradient accumulation with the
  fewest micro-batches whose activations fit when a whole batch's do not, where the runtime can
  accumulate. With a global batch B (the graph read at the micro-batch), D divides B and each replica
  runs B / D samples per step in micro-batches of a size that divides them: the first layouts take
  one sample per micro-batch (the smallest bubble), the descent (`neighbours.py`) walks the size up;
- recomputation: full where a layout's activations do not fit without it (it costs a forward per
  step); selective (only the attention cores: the largest activations for the least compute) wherever
  activations are tight — more than `TIGHT_SHARE` of the device — and, under a global batch, always,
  each split's variants the memory estimate fits first;
- schedule: 1F1B (GPipe where the micro-batches are fewer than the stages), and under a global batch
  interleaved 1F1B with two chunks per rank too;
- sequence parallelism with every tensor degree > 1 under a global batch (Megatron's and torchtitan's
  default with tensor parallelism), and async tensor parallelism with it where the rules allow (an engine,
  compiled blocks); the descent tries the other values;
- precision and compile: the request's; the descent tries the others where `allow_precision` and
  `allow_compile` admit them.
Context degrees, the other interleavings, zero-bubble schedules and micro-batch sizes are reached by
the descent from these, one dimension at a time. Memory is an estimate here, only for cutting and for
offering recomputation; the simulator decides what fits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from optimizer_service.search.dimensions import (
    MAX_STAGES,
    Rules,
    devices_per_node,
    divisors,
    rules_for,
    uncovered,
)
from optimizer_service.search.stage_cuts import LayerFigures, StageCuts, cut_by_compute, cut_under_cap
from simulator.context import SimContext
from simulator.encoding import Precision, Schedule
from stratagem.parallel_rules import graph_accumulation_refusal, graph_pipeline_refusal
from stratagem.tensor_plan import candidate_splits

__all__ = ["MAX_STAGES", "MeshChoice", "estimated_to_fit", "mesh_choices", "mesh_notes"]

MICRO_FACTORS = (1, 2, 4, 8)
"""Micro-batches per stage tried with a pipeline: m = factor × P (the bubble is (P-1)/(m+P-1))."""
CORE_VIRTUAL_STAGES = 2
"""Chunks per rank of the interleaved layouts the search starts from (the descent tries the others)."""
TIGHT_SHARE = 0.5
"""Activations are tight when a layout's estimated memory passes this share of the device: selective
recomputation is then offered beside none."""
SCHEDULE_NAMES = {
    Schedule.ONE_F_ONE_B: "1F1B",
    Schedule.GPIPE: "GPipe",
    Schedule.INTERLEAVED: "interleaved 1F1B",
    Schedule.ZERO_BUBBLE: "zero-bubble",
}
PRECISION_LABELS = {p: p.name.lower().replace("_", "-") for p in Precision}
RECOMPUTE_LABELS = {
    "full": "recomputed",
    "selective": "selective recomputation",
    "selective-op": "per-op checkpointing",
}


@dataclass(frozen=True)
class MeshChoice:
    """One layout of the replicas: degrees, stages, micro-batches, schedule, recomputation, sequence
    parallelism, precision, compile and async tensor parallelism (how the variables synchronize is the
    row's per-variable business)."""

    data: int
    tensor: int = 1
    pipeline: int = 1
    micro_batches: int = 1
    schedule: Schedule = Schedule.ONE_F_ONE_B
    layer_stage: tuple[int, ...] = ()
    """Chunk of each layer (empty: all in chunk 0); chunk i runs on pipeline rank i % pipeline."""
    split: str = field(default="", compare=False)
    """How the stages were cut: `compute` or `memory cap`."""
    recompute: bool = False
    """Full activation recomputation of the numbered blocks."""
    context: int = 1
    virtual_stages: int = 1
    selective: bool = False
    """Selective recomputation: the attention cores of the numbered blocks."""
    sequence_parallel: bool = False
    micro_batch_size: int = 0
    """Samples per micro-batch under a global batch (0: the graph's batch is a replica's step)."""
    precision: int = Precision.FP32
    selective_op: bool = False
    """Per-op selective checkpointing of the numbered blocks (torchtitan's `selective_ac_option = "op"`)."""
    compile: bool = False
    """`torch.compile` of each numbered block."""
    async_tp: bool = False
    """Async tensor parallelism: sequence parallelism's collectives pipelined with their matmuls."""

    @property
    def recompute_mode(self) -> str:
        if self.recompute:
            return "full"
        return "selective" if self.selective else "selective-op" if self.selective_op else "none"

    def label(self) -> str:
        text = f"data({self.data})×tensor({self.tensor})×pipeline({self.pipeline})"
        if self.context > 1:
            text += f"×context({self.context})"
        size = f" of {self.micro_batch_size}" if self.micro_batch_size else ""
        count = f"{self.micro_batches} micro-batches{size}" if self.micro_batches > 1 else f"one micro-batch{size}"
        if self.pipeline > 1:
            schedule = SCHEDULE_NAMES[Schedule(self.schedule)]
            chunks = f" ({self.virtual_stages} chunks per rank)" if self.virtual_stages > 1 else ""
            text += f", {count} {schedule}{chunks}"
            text += f", stages by {self.split}" if self.split else ""
        elif self.micro_batches > 1:
            text += f", {count} accumulated"
        elif self.micro_batch_size:
            text += f", {count}"
        if self.sequence_parallel:
            text += ", sequence parallel" + (" (async)" if self.async_tp else "")
        if self.recompute_mode != "none":
            text += f", {RECOMPUTE_LABELS[self.recompute_mode]}"
        if self.precision != Precision.FP32:
            text += f", {PRECISION_LABELS[Precision(self.precision)]}"
        if self.compile:
            text += ", compiled"
        return text


class RecomputeFlags(TypedDict):
    recompute: bool
    selective: bool
    selective_op: bool


def recompute_flags(mode: str) -> RecomputeFlags:
    """A recomputation mode as `MeshChoice`'s fields."""
    return {"recompute": mode == "full", "selective": mode == "selective", "selective_op": mode == "selective-op"}


def mesh_choices(context: SimContext, rules: Rules | None = None, cuts: StageCuts | None = None) -> list[MeshChoice]:
    """The layouts the search starts from; the first is plain data parallelism over every device (under
    a global batch the devices do not divide, the first legal layout)."""
    rules = rules or rules_for(context)
    cuts = cuts or StageCuts(context, rules)
    if rules.global_batch is not None:
        return _unique(_global_meshes(context, rules, cuts))
    devices = rules.devices
    figures = LayerFigures(context)
    starts = np.asarray(rules.starts)
    out = [MeshChoice(data=devices, precision=rules.precisions[0], compile=rules.compiles[0])]
    for tensor in rules.tensor:
        for pipeline in divisors(devices // tensor):
            if pipeline > rules.max_pipeline(tensor):
                break
            out.extend(_meshes_for(figures, starts, rules, tensor, pipeline))
    return _unique(out)


def _global_meshes(context: SimContext, rules: Rules, cuts: StageCuts) -> list[MeshChoice]:
    """Under a global batch: every tensor × pipeline factorization whose data degree divides the batch,
    one sample per micro-batch (as many as the replica's step holds where the runtime cannot
    accumulate), 1F1B and interleaved 1F1B with two chunks per rank where legal (Megatron's and
    torchtitan's usual pipelines), each legal recomputation, sequence parallel with tensor > 1 (async
    where legal), the request's precision and compile."""
    assert rules.global_batch is not None
    out = []
    for tensor in rules.tensor:
        for pipeline in divisors(rules.devices // tensor):
            if pipeline > rules.max_pipeline(tensor):
                break
            data = rules.devices // (tensor * pipeline)
            if rules.global_batch % data:
                continue
            per_replica = rules.global_batch // data
            size = 1 if pipeline > 1 or rules.accumulate else per_replica
            micro = per_replica // size
            legal = rules.schedules(pipeline, micro)
            schedules = [legal[0]] + [s for s in legal if s == (Schedule.INTERLEAVED, CORE_VIRTUAL_STAGES)]
            sequence = tensor > 1 and rules.sequence_parallel
            compile = rules.compiles[0]
            for (schedule, virtual), mode in itertools.product(schedules, rules.recompute_modes(pipeline)):
                out.append(
                    MeshChoice(
                        data=data,
                        tensor=tensor,
                        pipeline=pipeline,
                        micro_batches=micro,
                        schedule=schedule,
                        virtual_stages=virtual,
                        layer_stage=cuts.balanced(tensor, pipeline * virtual),
                        split="compute" if pipeline > 1 else "",
                        sequence_parallel=sequence,
                        micro_batch_size=size,
                        precision=rules.precisions[0],
                        compile=compile,
                        async_tp=rules.async_tp_ok(tensor, sequence_parallel=sequence, compile=compile),
                        **recompute_flags(mode),
                    )
                )
    plain = [m for m in out if m.data == rules.devices and m.recompute_mode == "none"]
    return plain + _fitting_first([m for m in out if m not in plain], cuts.figures, rules)


def _fitting_first(meshes: list[MeshChoice], figures: LayerFigures, rules: Rules) -> list[MeshChoice]:
    """Each split's variants with those the memory estimate fits first (stable otherwise): a split's first
    variant is the one every split gets priced at before any split's second (`proposals._layout_order`),
    and a large model's split without recomputation never fits."""
    return sorted(meshes, key=lambda mesh: not estimated_to_fit(mesh, figures, rules))


def estimated_to_fit(mesh: MeshChoice, figures: LayerFigures, rules: Rules) -> bool:
    """Whether a global batch's layout fits by the cutting estimate (selective recomputation counts as
    none); the simulator decides what fits."""
    samples = mesh.micro_batch_size / max(rules.graph_batch, 1)
    return figures.fits_per_micro_batch(
        mesh.layer_stage, mesh.tensor, mesh.pipeline, mesh.micro_batches, samples, recompute=mesh.recompute
    )


def mesh_notes(context: SimContext, rules: Rules | None = None) -> list[str]:
    """Why the space holds no tensor or pipeline layouts for this graph, in words for the space report."""
    rules = rules or rules_for(context)
    notes = [f"mesh: {note}" for note in rules.notes]
    if rules.runner == "stratagem":
        refusal = graph_pipeline_refusal(context.graph)
        if refusal is not None and not any(note.startswith("mesh: no pipeline stages") for note in notes):
            notes.append(f"mesh: no pipeline stages: {refusal}")
        refusal = graph_accumulation_refusal(context.graph)
        if refusal is not None:
            notes.append(f"mesh: no accumulated micro-batches: {refusal}")
    devices = rules.devices
    degrees = [t for t in divisors(devices_per_node(context)) if t > 1 and devices % t == 0]
    if degrees and not set(degrees) & set(rules.tensor):
        missing = uncovered(context, candidate_splits(context.graph), degrees[0])
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        notes.append(
            f"mesh: no tensor degree: the simulator would price {shown or 'no layer'} as split, which the runtime's "
            "plan cannot split (docs/hybrid.md says what it splits)"
        )
    return notes


def _meshes_for(
    figures: LayerFigures, starts: np.ndarray, rules: Rules, tensor: int, pipeline: int
) -> list[MeshChoice]:
    data = rules.devices // (tensor * pipeline)
    batch = rules.graph_batch
    precision, compile = rules.precisions[0], rules.compiles[0]
    selective = "selective" in rules.recompute_modes(pipeline)
    if pipeline == 1:
        out = []
        for m, mode in _accumulation(figures, tensor, batch, accumulate=rules.accumulate, selective=selective):
            out.append(
                MeshChoice(
                    data=data,
                    tensor=tensor,
                    micro_batches=m,
                    precision=precision,
                    compile=compile,
                    **recompute_flags(mode),
                )
            )
        return out
    cost = figures.cost(tensor)
    balanced = cut_by_compute(cost, starts, pipeline)
    recompute = "full" in rules.recompute_modes(pipeline)
    out = []
    for micro, schedule in _micro_batches(batch, pipeline):
        modes = ["none"]
        if (
            selective
            and figures.fullest_stage(balanced, tensor, pipeline, micro, schedule) > TIGHT_SHARE * figures.capacity
        ):
            modes.append("selective")
        if recompute and figures.over_cap(balanced, tensor, pipeline, micro, schedule, recompute=False):
            modes.append("full")
        for mode in modes:
            full = mode == "full"
            stage, split = balanced, "compute"
            if figures.over_cap(stage, tensor, pipeline, micro, schedule, recompute=full):
                capped = cut_under_cap(figures, cost, starts, tensor, pipeline, micro, schedule, full)
                if capped is not None:
                    stage, split = capped, "memory cap"
            out.append(
                MeshChoice(
                    data=data,
                    tensor=tensor,
                    pipeline=pipeline,
                    micro_batches=micro,
                    schedule=schedule,
                    layer_stage=tuple(int(s) for s in stage),
                    split=split,
                    precision=precision,
                    compile=compile,
                    **recompute_flags(mode),
                )
            )
    return out


# --- micro-batches ------------------------------------------------------------------------------------


def _micro_batches(batch: int, pipeline: int) -> list[tuple[int, Schedule]]:
    """P·(1, 2, 4, 8) and one sample per micro-batch, where they divide the batch (1F1B needs m >= P)."""
    counts = sorted(
        {f * pipeline for f in MICRO_FACTORS if batch % (f * pipeline) == 0} | ({batch} if batch >= pipeline else set())
    )
    return [(m, Schedule.ONE_F_ONE_B) for m in counts] or [(batch, Schedule.GPIPE)]


def pipeline_micro_batches(batch: int, pipeline: int) -> list[int]:
    """The micro-batch counts a pipeline of `pipeline` stages takes on a replica batch of `batch`."""
    return [m for m, _ in _micro_batches(batch, pipeline)]


def _accumulation(
    figures: LayerFigures, tensor: int, batch: int, *, accumulate: bool, selective: bool
) -> list[tuple[int, str]]:
    """(micro-batches, recomputation): one micro-batch; selective recomputation where activations are
    tight; where a whole batch's activations do not fit, the fewest accumulated micro-batches that do (one,
    where the runtime cannot accumulate), and full recomputation with the fewest micro-batches that fit."""
    static = figures.static(tensor).sum()
    out = [(1, "none")]
    plain = static + figures.activations(tensor, False).sum()
    if selective and plain > TIGHT_SHARE * figures.capacity:
        out.append((1, "selective"))
    for recompute in (False, True):
        acts = figures.activations(tensor, recompute).sum() + figures.peak(tensor, recompute)
        if static + acts <= figures.capacity and not recompute:
            return out
        fitting = [m for m in divisors(batch) if static + acts / m <= figures.capacity] if accumulate else [1]
        out.append((fitting[0] if fitting else batch, "full" if recompute else "none"))
    return list(dict.fromkeys(out))


def _unique(meshes: list[MeshChoice]) -> list[MeshChoice]:
    return list(dict.fromkeys(meshes))
