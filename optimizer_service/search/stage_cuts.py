"""Where a pipeline is cut: compute-balanced stage splits, and, where a balanced split does not fit,
the most balanced one that does, from per-layer estimates of work and memory.

The memory here is an estimate for cutting and for offering recomputation (parameters, gradients and
optimizer state of a stage's layers, plus the schedule's activations in flight), held against the room
the simulator fits live tensors by (`simulator.memory.tensor_room`); the simulator decides what fits.
"""

from __future__ import annotations

import numpy as np

from optimizer_service.search.dimensions import Rules
from simulator.compute import layer_times
from simulator.context import SimContext
from simulator.encoding import Schedule
from simulator.memory import tensor_room
from simulator.pipeline import block_peak
from stratagem.stages import balanced_cuts

__all__ = ["LayerFigures", "StageCuts", "cut_by_compute", "cut_under_cap"]


class StageCuts:
    """Compute-balanced stage cuts per (tensor degree, chunks), worked out once per search."""

    def __init__(self, context: SimContext, rules: Rules) -> None:
        self.figures = LayerFigures(context)
        self.starts = np.asarray(rules.starts)
        self._cuts: dict[tuple[int, int], tuple[int, ...]] = {}

    def balanced(self, tensor: int, chunks: int) -> tuple[int, ...]:
        if chunks <= 1:
            return ()
        key = (tensor, chunks)
        found = self._cuts.get(key)
        if found is None:
            stage = cut_by_compute(self.figures.cost(tensor), self.starts, chunks)
            found = self._cuts[key] = tuple(int(s) for s in stage)
        return found


# --- stage splits -------------------------------------------------------------------------------------


def _stages_from_cuts(cuts: np.ndarray, layers: int) -> np.ndarray:
    """[L] stage per layer from the first layer of stages 1..P-1."""
    stage = np.zeros(layers, dtype=np.int8)
    for s, start in enumerate(cuts, start=1):
        stage[start:] = s
    return stage


def cut_by_compute(cost: np.ndarray, starts: np.ndarray, pipeline: int) -> np.ndarray:
    """Cut at the unit boundaries nearest to equal shares of the work (every stage keeps a unit; the
    first unit starts at layer 0, so no cut is made there)."""
    cuts = balanced_cuts(cost, starts, pipeline, first=1)
    return _stages_from_cuts(np.array(cuts, dtype=np.intp), len(cost))


def cut_under_cap(
    figures: LayerFigures,
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


class LayerFigures:
    """Per layer, on the slowest compute device kind: work, and memory by tensor degree (for cutting),
    against the room the smallest device leaves live tensors (`tensor_room`, as the simulator decides)."""

    def __init__(self, context: SimContext) -> None:
        self.context = context
        kinds = context.device_kind[context.compute_device_indices]
        self.kind = int(kinds[np.argmax(context.kind_slowness[kinds])])
        self.capacity = float(tensor_room(context, kinds).min())
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

    def fullest_stage(self, stage: np.ndarray, tensor: int, pipeline: int, micro: int, schedule: Schedule) -> float:
        """Bytes on the fullest stage without recomputation."""
        return float(self._per_stage(stage, tensor, pipeline, micro, schedule, recompute=False).max())

    def over_cap(
        self, stage: np.ndarray, tensor: int, pipeline: int, micro: int, schedule: Schedule, *, recompute: bool
    ) -> bool:
        return bool(
            (self._per_stage(stage, tensor, pipeline, micro, schedule, recompute=recompute) > self.capacity).any()
        )

    def fits_per_micro_batch(
        self, chunks: tuple[int, ...], tensor: int, pipeline: int, micro: int, samples: float, *, recompute: bool
    ) -> bool:
        """Whether every pipeline rank's estimate fits with `micro` micro-batches of `samples` graph batches
        each (a global batch's layouts): its chunks' (`chunks[layer]`, chunk c on rank c mod P) state,
        plus 1F1B's in-flight micro-batches' activations, plus a recomputed block's rebuild."""
        stage = np.asarray(chunks, dtype=np.intp) % pipeline if chunks else np.zeros(self.context.num_layers, np.intp)
        static = np.bincount(stage, weights=self.static(tensor), minlength=pipeline)
        acts = np.bincount(stage, weights=self.activations(tensor, recompute), minlength=pipeline) * samples
        flight = np.minimum(micro, pipeline - np.arange(pipeline))
        need = static + acts * flight + self.peak(tensor, recompute) * samples
        return bool((need <= self.capacity).all())

    def _per_stage(
        self, stage: np.ndarray, tensor: int, pipeline: int, micro: int, schedule: Schedule, *, recompute: bool
    ) -> np.ndarray:
        per_stage = np.bincount(stage, weights=self.static(tensor), minlength=pipeline)
        acts = np.bincount(stage, weights=self.activations(tensor, recompute), minlength=pipeline) / micro
        flight = (
            np.full(pipeline, micro)
            if schedule == Schedule.GPIPE
            else np.minimum(micro, pipeline - np.arange(pipeline))
        )
        return per_stage + acts * flight + self.peak(tensor, recompute) / micro
