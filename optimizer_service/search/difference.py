"""What made the difference: a candidate against its nearest neighbour that differs in one dimension.

The neighbours are the ones the descent walks (`neighbours.py`): the same layout with one dimension
changed (a degree traded with the data degree, the micro-batch size, the schedule, recomputation,
sequence or async tensor parallelism, compile, precision, the ZeRO stage, shard group or fp8
all-gathers). They are simulated here again, with
the candidate, so every number quoted is the simulator's for exactly these rows:

- the nearest neighbour is the fastest one that fits: what it would cost to change the dimension that
  separates them, and in which parts of the step (compute, bubble, communication) the time goes;
- a neighbour that does not fit names the dimension that makes the candidate fit at all; where a smaller
  micro-batch would make that neighbour fit, the price of that repair is quoted too ("full
  recomputation costs 31% more compute but lets micro-batches of 4 fit, which halves the pipeline
  bubble").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optimizer_service.search.assign import respect_mesh, set_mesh
from optimizer_service.search.evaluate import normalized_step
from optimizer_service.search.neighbours import (
    Change,
    complete,
    dimension_words,
    mesh_of_row,
    neighbour_rows,
    value_words,
    zero_of_row,
)
from optimizer_service.search.space import Space
from simulator import CandidateBatch, Prediction, predictions, simulate_batch

PARTS = {
    "compute": "compute",
    "tensor_parallel": "tensor-parallel communication",
    "pipeline_bubble": "the pipeline bubble",
    "pipeline_p2p": "pipeline transfers",
    "allreduce": "exposed all-reduce",
    "sharded": "ZeRO/FSDP communication",
    "ps": "parameter-server waiting",
    "optimizer_update": "the optimizer update",
    "context_parallel": "ring-attention exchange",
}
FIT_ORDER = (
    "recompute",
    "zero",
    "sharded variables",
    "shard group",
    "fp8 all-gather",
    "micro-batch",
    "pipeline",
    "tensor",
    "model split",
    "context",
    "context split",
)
"""Dimensions checked, in this order, for the one that makes a candidate fit."""
NOTABLE = 0.02
"""A part of the step that changes by less than this share of it is not worth naming."""


def difference(space: Space, batch: CandidateBatch, i: int) -> dict[str, Any] | None:
    """The dimension that made the difference for row i, with numbers and a sentence; None without
    neighbours."""
    rows, found = neighbour_rows(space, batch, i)
    if not found:
        return None
    respect_mesh(space, rows)
    both = CandidateBatch.concat(batch.take([i]), rows)
    result = simulate_batch(space.context, both)
    scores = np.where(
        result.feasible, normalized_step(space.context, both, result.step_time, space.reference_samples), np.inf
    )
    mesh, zero = mesh_of_row(space, batch, i), zero_of_row(space, batch, i)
    record: dict[str, Any] = {"layout": f"{mesh.label()}; {zero.words()}", "neighbours": len(found)}
    fit = _what_fits(space, batch, i, rows, found, result)
    sentences = []
    if fit is not None:
        record["dimension"] = fit["dimension"]
        sentences.append(fit["sentence"])
    fitting = np.flatnonzero(np.isfinite(scores[1:]))
    if np.isfinite(scores[0]) and len(fitting):
        j = int(fitting[np.argmin(scores[1:][fitting])])
        explained = predictions(space.context, both, [0, j + 1])
        change = found[j]
        nearest = {
            "dimension": change.dimension,
            "winner": value_words(change.dimension, mesh, zero),
            "neighbour": _words(space, rows, j, change),
            "slower": float(scores[j + 1] / scores[0] - 1.0),
        }
        record["nearest"] = nearest
        record.setdefault("dimension", change.dimension)
        sentences.append(
            _nearest_sentence(nearest, explained[0], explained[1], same_step=_same_step(both, j + 1), first=not fit)
        )
    if not sentences:
        return None
    record["sentence"] = " ".join([f"Layout: {record['layout']}.", *sentences])
    return record


def _same_step(both: CandidateBatch, j: int) -> bool:
    return bool(both.data[0] == both.data[j] or both.micro_batch_size[0] > 0)


def _words(space: Space, rows: CandidateBatch, j: int, change: Change) -> str:
    return value_words(change.dimension, mesh_of_row(space, rows, j), zero_of_row(space, rows, j))


def _nearest_sentence(
    nearest: dict[str, Any], mine: Prediction, near: Prediction, *, same_step: bool, first: bool
) -> str:
    per = "per step" if same_step else "per sample"
    slower = nearest["slower"]
    pace = f"predicted {_slower(1.0 + slower)} {per}" if slower >= 0.005 else "predicted about as fast (within 0.5%)"
    change = f"{nearest['neighbour']} instead of {nearest['winner']}"
    if first:
        head = f"{_upper(dimension_words(nearest['dimension']))} made the difference: with {change}, the nearest alternative is {pace}"
    else:
        head = f"The nearest alternative that fits changes {dimension_words(nearest['dimension'])} ({change}) and is {pace}"
    parts = _changed_parts(mine, near)
    return head + (f": {'; '.join(parts)}." if parts else ".")


def _changed_parts(mine: Prediction, near: Prediction) -> list[str]:
    """The parts of the step that differ most between the two, as 'X would take A instead of B'."""
    step = max(mine.step_time_s, 1e-12)
    deltas = {k: near.breakdown.get(k, 0.0) - v for k, v in mine.breakdown.items()}
    notable = sorted((k for k in deltas if abs(deltas[k]) >= NOTABLE * step), key=lambda k: -abs(deltas[k]))[:2]
    return [
        f"{PARTS.get(k, k)} would take {_s(near.breakdown.get(k, 0.0))} instead of {_s(mine.breakdown[k])}"
        for k in notable
    ]


def _what_fits(
    space: Space, batch: CandidateBatch, i: int, rows: CandidateBatch, found: list[Change], result: Any
) -> dict[str, Any] | None:
    """The first dimension (in FIT_ORDER) whose other value does not fit, and what repairing it costs."""
    if not bool(result.feasible[0]):
        return None
    mesh, zero = mesh_of_row(space, batch, i), zero_of_row(space, batch, i)
    for dimension in FIT_ORDER:
        misses = [j for j, c in enumerate(found) if c.dimension == dimension and not bool(result.feasible[j + 1])]
        if not misses:
            continue
        j = min(misses, key=lambda k: float(result.memory[k + 1]))
        mine = value_words(dimension, mesh, zero)
        other = _words(space, rows, j, found[j])
        need, have = float(result.memory[j + 1]), float(result.capacity[j + 1])
        repaired = _repair(space, rows, j) if dimension != "micro-batch" else None
        head = f"{_upper(dimension_words(dimension))} made the difference: "
        if repaired is not None:
            return {"dimension": dimension, "sentence": head + _repair_sentence(space, batch, i, mine, other, repaired)}
        return {
            "dimension": dimension,
            "sentence": head + f"{mine} is what makes it fit; with {other} it needs {_gb(need)} per device "
            f"(room for {_gb(have)} of tensors).",
        }
    return None


def _repair(space: Space, rows: CandidateBatch, j: int) -> tuple[CandidateBatch, int] | None:
    """The neighbour j with the largest smaller micro-batch that fits, as a one-row batch, or None."""
    mesh = mesh_of_row(space, rows, j)
    if space.rules.global_batch is None or mesh.micro_batch_size <= 1:
        return None
    step = space.rules.global_batch // mesh.data
    sizes = [s for s in range(mesh.micro_batch_size - 1, 0, -1) if step % s == 0]
    candidates = [complete(space, mesh, micro_batch_size=s, micro_batches=step // s) for s in sizes]
    meshes = [m for m in candidates if m is not None]
    if not meshes:
        return None
    tries = rows.take(np.full(len(meshes), j, dtype=np.intp))
    for r, m in enumerate(meshes):
        set_mesh(space, tries, np.array([r]), space.register(m))
    result = simulate_batch(space.context, tries)
    fitting = np.flatnonzero(result.feasible)
    if not len(fitting):
        return None
    return tries, int(fitting[0])


def _repair_sentence(
    space: Space, batch: CandidateBatch, i: int, mine: str, other: str, repaired: tuple[CandidateBatch, int]
) -> str:
    tries, r = repaired
    both = CandidateBatch.concat(batch.take([i]), tries.take([r]))
    me, fix = predictions(space.context, both)
    size, fixed = int(batch.micro_batch_size[i]), int(tries.micro_batch_size[r])
    compute = me.breakdown["compute"] / max(fix.breakdown["compute"], 1e-12) - 1.0
    cost = f"costs {compute:.0%} more compute but " if compute > NOTABLE else ""
    deltas = {k: fix.breakdown.get(k, 0.0) - v for k, v in me.breakdown.items() if k != "compute"}
    key = max(deltas, key=lambda k: deltas[k])
    gain = (
        f", which cuts {PARTS.get(key, key)} from {_s(fix.breakdown[key])} to {_s(me.breakdown[key])}"
        if deltas[key] > NOTABLE * me.step_time_s
        else ""
    )
    return (
        f"{mine} {cost}lets micro-batches of {size} fit (with {other}, only micro-batches of {fixed} do){gain}; "
        f"that alternative is predicted {_slower(fix.step_time_s / max(me.step_time_s, 1e-12))}."
    )


def _slower(ratio: float) -> str:
    return f"{ratio:.1f}× slower" if ratio >= 2 else f"{ratio - 1.0:.0%} slower"


def _upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def _s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"
