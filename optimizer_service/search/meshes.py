"""The mesh choices: data × tensor × pipeline factorizations, stage splits and micro-batch counts.

For G compute devices, N per node:
- tensor degree T: divides N (a tensor group fills part of one node, never two: its all-reduces sit on
  the critical path) and G, and the runtime's plan for T (`stratagem.tensor_plan`: heads, column/row
  pairs, vocabulary) splits every layer the simulator prices as split — so a CNN, whose convolutions
  the runtime cannot split, or an attention without a recognised layout, gets no tensor degree;
- pipeline degree P: divides G / T, at most the number of places a model can be cut (between blocks:
  `units`); data degree D = G / (T · P). Only for graphs the runtime can cut
  (`stratagem.parallel_rules.graph_pipeline_route`): an nn.Sequential that leaves its loss to
  `loss_fn`, cut between units, or a model that returns its loss with numbered blocks (the zoo's
  transformers), cut only at the beginning of blocks, with T = 1 and no recomputation (its stages are
  traced); for others P = 1, and `mesh_notes` says why;
- stages: contiguous runs of units, cut where the forward + backward work reaches equal shares
  (balanced by compute); if a stage then exceeds the device memory, re-cut greedily under the memory
  cap (parameters, gradients and optimizer state of its layers, plus 1F1B's activations in flight);
- micro-batches m: with a pipeline P, 2P, 4P, 8P and one sample each (m = batch), where they divide
  the per-replica batch (1F1B; GPipe with m = batch when the batch is smaller than P); without one, 1, and gradient accumulation with
  the fewest micro-batches whose activations fit when a whole batch's do not, where the runtime can
  accumulate (`graph_accumulation_refusal`: a model that returns its loss needs batch-first inputs);
- activation recomputation: offered for a layout whose activations do not fit without it (it costs a
  forward per step, so it is never worth it where memory suffices).
Memory is an estimate here, only for cutting and for offering recomputation; the simulator decides
what fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.compute import layer_times
from simulator.context import SimContext
from simulator.encoding import Schedule
from simulator.pipeline import block_peak
from stratagem.parallel_rules import (
    Refusal,
    block_of,
    graph_accumulation_refusal,
    graph_pipeline_refusal,
    graph_pipeline_route,
)
from stratagem.tensor_plan import Split, candidate_splits, covered_layers

MAX_STAGES = 64
"""Deepest pipeline tried (the encoding's int8 `layer_stage` holds 127; Megatron's 1T model used 64)."""
MICRO_FACTORS = (1, 2, 4, 8)
"""Micro-batches per stage tried with a pipeline: m = factor × P (the bubble is (P-1)/(m+P-1))."""


@dataclass(frozen=True)
class MeshChoice:
    """One way to lay the replicas out: data × tensor × pipeline degrees, stages and micro-batches."""

    data: int
    tensor: int = 1
    pipeline: int = 1
    micro_batches: int = 1
    schedule: Schedule = Schedule.ONE_F_ONE_B
    layer_stage: tuple[int, ...] = ()
    """Stage of each layer (empty: all in stage 0)."""
    split: str = ""
    """How the stages were cut: `compute` or `memory cap`."""
    recompute: bool = False
    """Activation recomputation of the numbered blocks."""

    def label(self) -> str:
        text = f"data({self.data})×tensor({self.tensor})×pipeline({self.pipeline})"
        if self.pipeline > 1:
            schedule = "1F1B" if self.schedule == Schedule.ONE_F_ONE_B else "GPipe"
            text += f", {self.micro_batches} micro-batches {schedule}, stages by {self.split}"
        elif self.micro_batches > 1:
            text += f", {self.micro_batches} micro-batches accumulated"
        return text + (", recomputed" if self.recompute else "")


def mesh_choices(context: SimContext) -> list[MeshChoice]:
    """Every mesh the search may pick; the first is plain data parallelism over every device."""
    devices = len(context.compute_device_indices)
    per_node = _devices_per_node(context)
    starts = context.unit_starts
    figures = _LayerFigures(context)
    out = [MeshChoice(data=devices)]
    route = graph_pipeline_route(context.graph)
    if route == "blocks":
        starts = _block_starts(context)
    accumulate = graph_accumulation_refusal(context.graph) is None
    for tensor in _tensor_degrees(context, devices, per_node):
        deepest = (
            1 if isinstance(route, Refusal) or (route == "blocks" and tensor > 1) else min(len(starts), MAX_STAGES)
        )
        for pipeline in _divisors(devices // tensor):
            if pipeline > deepest:
                break
            meshes = _meshes_for(context, figures, starts, devices, tensor, pipeline, accumulate=accumulate)
            out.extend(m for m in meshes if not (route == "blocks" and m.pipeline > 1 and m.recompute))
    return _unique(out)


def _block_starts(context: SimContext) -> np.ndarray:
    """The first layer, and the first layer of each numbered block: where traced stages may be cut
    (`parallel_rules.block_cuts`), so embeddings stay in the first stage and the head in the last."""
    names = context.layer_names
    blocks = [block_of(names[i]) for i in context.unit_starts]
    return np.array(
        [0] + [int(i) for i, block in zip(context.unit_starts, blocks, strict=True) if block is not None and i > 0],
        dtype=context.unit_starts.dtype,
    )


def mesh_notes(context: SimContext) -> list[str]:
    """Why the space holds no tensor or pipeline layouts for this graph, in words for the space report."""
    notes = []
    refusal = graph_pipeline_refusal(context.graph)
    if refusal is not None:
        notes.append(f"mesh: no pipeline stages: {refusal}")
    refusal = graph_accumulation_refusal(context.graph)
    if refusal is not None:
        notes.append(f"mesh: no accumulated micro-batches: {refusal}")
    devices = len(context.compute_device_indices)
    degrees = [t for t in _divisors(_devices_per_node(context)) if t > 1 and devices % t == 0]
    if degrees and not set(degrees) & set(_tensor_degrees(context, devices, _devices_per_node(context))):
        missing = _uncovered(context, candidate_splits(context.graph), degrees[0])
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        notes.append(
            f"mesh: no tensor degree: the simulator would price {shown or 'no layer'} as split, which the runtime's "
            "plan cannot split (docs/hybrid.md says what it splits)"
        )
    return notes


def _meshes_for(
    context: SimContext,
    figures: _LayerFigures,
    starts: np.ndarray,
    devices: int,
    tensor: int,
    pipeline: int,
    *,
    accumulate: bool,
) -> list[MeshChoice]:
    data = devices // (tensor * pipeline)
    batch = context.batch_size
    if pipeline == 1:
        return [
            MeshChoice(data=data, tensor=tensor, micro_batches=m, recompute=r)
            for m, r in _accumulation(figures, tensor, batch, accumulate=accumulate)
        ]
    cost = figures.cost(tensor)
    balanced = _cut_by_compute(cost, starts, pipeline)
    out = []
    for micro, schedule in _micro_batches(batch, pipeline):
        for recompute in (False, True):
            if recompute and not figures.over_cap(balanced, tensor, pipeline, micro, schedule, recompute=False):
                break  # it fits without recomputation, which would only add a forward
            stage, split = balanced, "compute"
            if figures.over_cap(stage, tensor, pipeline, micro, schedule, recompute=recompute):
                capped = _cut_under_cap(figures, cost, starts, tensor, pipeline, micro, schedule, recompute)
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
                    recompute=recompute,
                )
            )
    return out


# --- degrees and micro-batches ------------------------------------------------------------------------


def _tensor_degrees(context: SimContext, devices: int, per_node: int) -> list[int]:
    """1, and each T > 1 whose plan splits every layer the simulator splits at T."""
    splits = candidate_splits(context.graph)
    if not splits:
        return [1]
    return [t for t in _divisors(per_node) if devices % t == 0 and (t == 1 or not _uncovered(context, splits, t))]


def _uncovered(context: SimContext, splits: list[Split], tensor: int) -> list[str]:
    """Layers the simulator prices as split at degree `tensor` that the runtime's plan leaves whole."""
    covered = covered_layers(splits, tensor)
    return [name for i, name in enumerate(context.layer_names) if context.layer_tensor_split[i] and i not in covered]


def _micro_batches(batch: int, pipeline: int) -> list[tuple[int, Schedule]]:
    """P·(1, 2, 4, 8) and one sample per micro-batch, where they divide the batch (1F1B needs m >= P)."""
    counts = sorted(
        {f * pipeline for f in MICRO_FACTORS if batch % (f * pipeline) == 0} | ({batch} if batch >= pipeline else set())
    )
    return [(m, Schedule.ONE_F_ONE_B) for m in counts] or [(batch, Schedule.GPIPE)]


def _accumulation(figures: _LayerFigures, tensor: int, batch: int, *, accumulate: bool) -> list[tuple[int, bool]]:
    """(micro-batches, recompute): one micro-batch; where a whole batch's activations do not fit, the
    fewest accumulated micro-batches that do (one, where the runtime cannot accumulate), and
    recomputation with the fewest micro-batches that fit."""
    static = figures.static(tensor).sum()
    out = [(1, False)]
    for recompute in (False, True):
        acts = figures.activations(tensor, recompute).sum() + figures.peak(tensor, recompute)
        if static + acts <= figures.capacity and not recompute:
            return out
        fitting = [m for m in _divisors(batch) if static + acts / m <= figures.capacity] if accumulate else [1]
        out.append((fitting[0] if fitting else batch, recompute))
    return _ordered_unique(out)


def _ordered_unique(values: list[tuple[int, bool]]) -> list[tuple[int, bool]]:
    return list(dict.fromkeys(values))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _devices_per_node(context: SimContext) -> int:
    counts = np.bincount(context.device_node[context.compute_device_indices], minlength=context.num_nodes)
    return int(counts[counts > 0].min()) if counts.any() else 1


def _unique(meshes: list[MeshChoice]) -> list[MeshChoice]:
    seen, out = set(), []
    for mesh in meshes:
        if mesh not in seen:
            seen.add(mesh)
            out.append(mesh)
    return out


# --- stage splits -------------------------------------------------------------------------------------


def _stages_from_cuts(cuts: np.ndarray, layers: int) -> np.ndarray:
    """[L] stage per layer from the first layer of stages 1..P-1."""
    stage = np.zeros(layers, dtype=np.int8)
    for s, start in enumerate(cuts, start=1):
        stage[start:] = s
    return stage


def _cut_by_compute(cost: np.ndarray, starts: np.ndarray, pipeline: int) -> np.ndarray:
    """Cut at the unit boundaries nearest to equal shares of the work (every stage keeps a unit)."""
    before = np.concatenate([[0.0], np.cumsum(cost)])[starts]
    total = float(cost.sum())
    cuts = []
    low = 1
    for k in range(1, pipeline):
        high = len(starts) - (pipeline - k)
        index = int(np.clip(np.argmin(np.abs(before - k * total / pipeline)), low, high))
        cuts.append(starts[index])
        low = index + 1
    return _stages_from_cuts(np.array(cuts, dtype=np.intp), len(cost))


def _cut_under_cap(
    figures: _LayerFigures,
    cost: np.ndarray,
    starts: np.ndarray,
    tensor: int,
    pipeline: int,
    micro: int,
    schedule: Schedule,
    recompute: bool,
) -> np.ndarray | None:
    """The most balanced cut whose stages all fit (bisection on the largest stage's work), or None."""
    unit_cost = np.add.reduceat(cost, starts)
    unit_static = np.add.reduceat(figures.static(tensor), starts)
    unit_acts = np.add.reduceat(figures.activations(tensor, recompute), starts) / micro
    capacity = figures.capacity - figures.peak(tensor, recompute) / micro
    low, high = float(unit_cost.max()), float(unit_cost.sum())
    best = _pack(unit_cost, unit_static, unit_acts, high, pipeline, micro, schedule, capacity)
    if best is None:
        return None
    for _ in range(30):
        middle = 0.5 * (low + high)
        packed = _pack(unit_cost, unit_static, unit_acts, middle, pipeline, micro, schedule, capacity)
        if packed is None:
            low = middle
        else:
            best, high = packed, middle
    return _stages_from_cuts(np.array([starts[u] for u in best], dtype=np.intp), len(cost))


def _pack(
    cost: np.ndarray,
    static: np.ndarray,
    acts: np.ndarray,
    limit: float,
    pipeline: int,
    micro: int,
    schedule: Schedule,
    capacity: float,
) -> list[int] | None:
    """Greedy: fill stage s until its work passes `limit` or its memory the cap; the first unit of each
    later stage, or None when P stages are not enough. Fewer stages are split up to P (which only
    lowers the later stages' activations in flight)."""
    cuts: list[int] = []
    work = memory = 0.0
    for u in range(len(cost)):
        s = len(cuts)
        flight = micro if schedule == Schedule.GPIPE else min(micro, pipeline - s)
        need = static[u] + acts[u] * flight
        if u > 0 and (work + cost[u] > limit or memory + need > capacity):
            cuts.append(u)
            s += 1
            flight = micro if schedule == Schedule.GPIPE else min(micro, pipeline - s)
            need = static[u] + acts[u] * flight
            work = memory = 0.0
        if need > capacity or len(cuts) >= pipeline:
            return None
        work += cost[u]
        memory += need
    free = [u for u in range(1, len(cost)) if u not in cuts]
    while len(cuts) < pipeline - 1 and free:
        cuts.append(free.pop())
    return sorted(cuts) if len(cuts) == pipeline - 1 else None


class _LayerFigures:
    """Per layer, on the slowest compute device kind: work, and memory by tensor degree (for cutting)."""

    def __init__(self, context: SimContext) -> None:
        self.context = context
        kinds = context.device_kind[context.compute_device_indices]
        self.kind = int(kinds[np.argmax(context.kind_slowness[kinds])])
        self.capacity = float(context.kinds.memory_bytes[kinds].min())
        held = 2 * context.var_bytes + context.var_state_bytes
        L = context.num_layers
        self._split = (
            np.bincount(context.var_layer, weights=held * context.var_tensor_split, minlength=L)
            + context.layer_frozen_bytes * context.layer_tensor_split
        )
        self._whole = (
            np.bincount(context.var_layer, weights=held * ~context.var_tensor_split, minlength=L)
            + context.layer_frozen_bytes * ~context.layer_tensor_split
        )

    def cost(self, tensor: int) -> np.ndarray:
        fwd, bwd = layer_times(self.context, self.kind, tensor, 1)
        return fwd + bwd

    def static(self, tensor: int) -> np.ndarray:
        """[L] parameters, gradients and optimizer state a rank keeps for each layer."""
        return self._split / tensor + self._whole

    def activations(self, tensor: int, recompute: bool) -> np.ndarray:
        """[L] activations a rank keeps for each layer over the whole per-replica batch (with
        recomputation, a block's input at its first layer and nothing for the rest of it)."""
        context = self.context
        full = context.activation_bytes / np.where(context.layer_sharded_input, tensor, 1)
        return np.where(context.layer_recomputed, context.recompute_kept, full) if recompute else full

    def peak(self, tensor: int, recompute: bool) -> float:
        """With recomputation, the largest block's activations, rebuilt during its backward (whole batch)."""
        if not recompute:
            return 0.0
        context = self.context
        return float(
            block_peak(context, context.activation_bytes / np.where(context.layer_sharded_input, tensor, 1))[0]
        )

    def over_cap(
        self, stage: np.ndarray, tensor: int, pipeline: int, micro: int, schedule: Schedule, *, recompute: bool
    ) -> bool:
        per_stage = np.bincount(stage, weights=self.static(tensor), minlength=pipeline)
        acts = np.bincount(stage, weights=self.activations(tensor, recompute), minlength=pipeline) / micro
        flight = (
            np.full(pipeline, micro)
            if schedule == Schedule.GPIPE
            else np.minimum(micro, pipeline - np.arange(pipeline))
        )
        return bool((per_stage + acts * flight + self.peak(tensor, recompute) / micro > self.capacity).any())
