"""Pick the top-K so that they are K different ideas, not K copies of the best one.

Distance between two candidates is a Hamming distance on what a person would call the strategy:
per variable, its synchronizer kind, first server, shard count, algorithm and compressor, plus
whether it shares a fusion group with its backward neighbour (so regrouping counts, relabelling
does not); per candidate, the consistency and the layout (degrees, micro-batches, schedule, recomputation, sequence
parallelism, precision, shard group), each weighing as much as the minimum distance, so a different
layout is a different idea; per sharded variable, its ZeRO stage. First each pick must put at least `min_distance` variables on a different synchronizer
than every earlier pick; if that leaves fewer than K, the signature distance alone decides; then the
best remaining distinct candidates fill in.
"""

from __future__ import annotations

import math

import numpy as np

from optimizer_service.search.space import Space
from simulator.encoding import CandidateBatch, SyncKind


def signatures(space: Space, batch: CandidateBatch) -> np.ndarray:
    """[N, F] integer features whose Hamming distance says how different two candidates are."""
    order = space.backward_order
    group = batch.group[:, order]
    kind = batch.kind[:, order]
    joined = np.zeros_like(group)
    joined[:, 1:] = (group[:, 1:] == group[:, :-1]) & (kind[:, 1:] == kind[:, :-1])
    parts = [
        batch.kind,
        batch.server[:, :, 0],
        batch.shards,
        batch.algorithm,
        batch.compressor,
        batch.local_replication,
        joined,
        np.where(batch.kind == SyncKind.SHARDED, batch.zero_stage, 0),
    ]
    per_candidate = np.stack(
        [
            batch.consistency,
            batch.staleness,
            batch.data,
            batch.tensor,
            batch.pipeline,
            batch.micro_batches,
            batch.recompute,
            batch.context_parallel,
            batch.schedule,
            batch.virtual_stages,
            batch.selective,
            batch.sequence_parallel,
            batch.micro_batch_size,
            batch.precision,
            batch.shard_group,
            batch.selective_op,
            batch.compile,
            batch.async_tp,
            batch.fp8_gather,
        ],
        axis=1,
    )
    # a different layout is a different idea: its columns weigh as much as the minimum distance
    layout = np.tile(per_candidate.astype(np.int64), (1, default_min_distance(space)))
    return np.concatenate([p.astype(np.int64) for p in parts] + [layout], axis=1)


def default_min_distance(space: Space) -> int:
    """Five percent of the variables, at least two: a different idea, not a one-variable tweak."""
    return max(2, math.ceil(0.05 * space.num_variables))


def select_diverse(
    signature: np.ndarray, scores: np.ndarray, k: int, *, min_distance: int, mixes: np.ndarray | None = None
) -> list[int]:
    """Indices of up to k rows, best score first, as different as the candidates allow.

    Three passes, each filling what the stricter one left: rows whose synchronizer mix (`mixes`: per
    row, the per-variable synchronizer kinds) differs from every pick's in at least `min_distance`
    variables; then rows whose whole signature differs that much; then any row not identical to a pick.
    """
    order = [int(i) for i in np.argsort(scores, kind="stable") if np.isfinite(scores[i])]
    chosen: list[int] = []
    passes = [(mixes, min_distance)] if mixes is not None else []
    passes += [(signature, min_distance), (signature, 1)]
    for features, distance in passes:
        for i in order:
            if len(chosen) == k:
                break
            if i not in chosen and _far(features, i, chosen, distance):
                chosen.append(i)
    return sorted(chosen, key=lambda i: (scores[i], order.index(i)))


def _far(signature: np.ndarray, i: int, chosen: list[int], distance: int) -> bool:
    return all(_distance(signature[i], signature[j]) >= distance for j in chosen)


def _distance(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.count_nonzero(a != b))
