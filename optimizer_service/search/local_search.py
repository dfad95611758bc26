"""Batched simulated annealing from the best candidates found so far.

A handful of parents, picked diverse from the archive, each spawn many mutated children per round
(`moves.mutate`); all children are simulated as one batch. Each parent moves to its best child if
that child is faster, or, while the temperature is high, sometimes even if it is a little slower (so
the search can leave a local optimum). A parent that stops improving restarts from another archived
candidate. The temperature falls with the share of the budget used, so the schedule is the same
whether the budget is counted in candidates or in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optimizer_service.search.assign import server_traffic
from optimizer_service.search.evaluate import Evaluator
from optimizer_service.search.moves import mutate
from optimizer_service.search.select import default_min_distance, select_diverse, signatures
from optimizer_service.search.space import Space
from simulator.encoding import CandidateBatch

SUFFIX = " + local search"


@dataclass(frozen=True)
class AnnealingSettings:
    parents: int = 16
    children: int = 32
    """Children per parent per round; parents × children rows are simulated as one batch."""
    temperature: float = 0.02
    """At the start, a child 2% slower than its parent is accepted with probability 1/e."""
    restart_after: int = 8
    """Rounds without improvement before a parent restarts from the archive."""
    max_moves: int = 3
    give_up_after: int = 20
    """Rounds in a row that find nothing new before the space counts as explored (small spaces)."""


def anneal(
    space: Space, evaluator: Evaluator, rng: np.random.Generator, settings: AnnealingSettings | None = None
) -> int:
    """Run until the evaluator's budget is spent, or until rounds stop finding anything new; returns
    the number of rounds."""
    settings = settings or AnnealingSettings()
    archive = evaluator.archive
    if archive is None or evaluator.exhausted:
        return 0
    starts = select_diverse(
        signatures(space, archive.batch), archive.scores, settings.parents, min_distance=default_min_distance(space)
    )
    current = archive.batch.take(starts)
    scores = archive.scores[starts].copy()
    roots = np.array([str(label).removesuffix(SUFFIX) for label in archive.labels[starts]], dtype=object)
    stale = np.zeros(len(starts), dtype=np.int64)
    rounds = barren = 0
    while not evaluator.exhausted and barren < settings.give_up_after:
        parents = len(current)
        budget = min(evaluator.remaining, evaluator.affordable(parents * settings.children))
        per_parent = int(min(settings.children, max(1, budget // parents)))
        owner = np.repeat(np.arange(parents), per_parent)
        children = current.take(owner)
        traffic = server_traffic(space, current, np.arange(parents))[owner]
        mutate(space, children, rng, max_moves=settings.max_moves, traffic=traffic)
        child_scores = evaluator.evaluate(children, roots[owner] + SUFFIX, "local_search")
        barren = barren + 1 if evaluator.last_fresh == 0 else 0
        grid = child_scores.reshape(parents, per_parent)
        best = np.argmin(grid, axis=1)
        best_scores = grid[np.arange(parents), best]
        accept = _accept(best_scores, scores, settings.temperature * (1.0 - evaluator.fraction_used()), rng)
        stale = np.where(best_scores < scores, 0, stale + 1)
        chosen = np.flatnonzero(accept)
        _assign_rows(current, chosen, children, chosen * per_parent + best[chosen])
        scores[chosen] = best_scores[chosen]
        _restart(evaluator, current, scores, roots, stale, settings, rng)
        rounds += 1
    return rounds


def _accept(candidate: np.ndarray, current: np.ndarray, temperature: float, rng: np.random.Generator) -> np.ndarray:
    finite = np.isfinite(candidate)
    relative = np.where(finite, (candidate - current) / np.maximum(current, 1e-12), np.inf)
    if temperature <= 0:
        return finite & (relative < 0)
    with np.errstate(over="ignore"):
        chance = np.exp(-np.maximum(relative, 0.0) / temperature)
    return finite & ((relative < 0) | (rng.random(len(candidate)) < chance))


def _restart(
    evaluator: Evaluator,
    current: CandidateBatch,
    scores: np.ndarray,
    roots: np.ndarray,
    stale: np.ndarray,
    settings: AnnealingSettings,
    rng: np.random.Generator,
) -> None:
    """Parents stuck for `restart_after` rounds jump to a random one of the archive's best."""
    stuck = np.flatnonzero(stale >= settings.restart_after)
    archive = evaluator.archive
    if len(stuck) == 0 or archive is None:
        return
    pool = min(len(archive.scores), 4 * len(current))
    picks = rng.integers(pool, size=len(stuck))
    _assign_rows(current, stuck, archive.batch, picks)
    scores[stuck] = archive.scores[picks]
    roots[stuck] = [str(label).removesuffix(SUFFIX) for label in archive.labels[picks]]
    stale[stuck] = 0


def _assign_rows(target: CandidateBatch, rows: np.ndarray, source: CandidateBatch, source_rows: np.ndarray) -> None:
    if len(rows) == 0:
        return
    for name, array in target.arrays().items():
        array[rows] = getattr(source, name)[source_rows]
