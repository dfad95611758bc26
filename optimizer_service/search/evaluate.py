"""The one evaluation step: simulate a batch, enforce the budgets, remember the best, report progress.

Every candidate the search scores goes through `Evaluator.evaluate`, so the budgets hold however the
candidates were made: the candidate budget counts simulated rows (duplicates are recognised by a
hash of the row and answered from memory, uncounted), the time budget is checked between batches.
The archive keeps the best distinct rows seen so far, with how each was made, for the final pick.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simulator import CandidateBatch, SimContext, simulate_batch
from simulator.encoding import DTYPES
from simulator.step_graph import step_samples

INFEASIBLE = np.inf
"""The score of a candidate that does not fit, or that the budget left unevaluated."""


def normalized_step(
    context: SimContext, batch: CandidateBatch, step_time: np.ndarray, reference: float | None = None
) -> np.ndarray:
    """The score: seconds to train on `reference` samples — by default as many as one data-parallel step
    over every compute device does on the graph's batch (step time × devices / data degree). The graph's
    batch is per model replica, so a layout with fewer data-parallel replicas takes a smaller global batch
    per step, and its step time alone would flatter it; for plain data parallelism the score is the step
    time. Under a fixed global batch the reference is that batch, and the score is the step time."""
    if reference is None:
        reference = len(context.compute_device_indices) * context.batch_size
    return step_time * reference / (batch.data * step_samples(context, batch))


FIRST_PIECE = 16
"""Rows of the first piece `evaluate_in_pieces` takes, before it knows the pace: a row whose step graph
must be compiled first costs tens of milliseconds on a thousand-GPU layout, so a larger first piece can
spend a 2 s budget on its own."""
_HASH_SEED = 0x5EED
PER_MIX = 16
"""Most archived candidates with one synchronizer mix (the same kind for every variable) on one layout."""
MIX = ("kind", "tensor", "pipeline", "context_parallel")
"""What makes a mix: each variable's synchronizer, and the tensor, pipeline and context degrees."""


@dataclass(frozen=True)
class SearchProgress:
    phase: str
    """`baselines`, `proposals`, `sampling`, `local_search` or `finalizing`."""
    evaluated: int
    best_step_time_s: float | None
    """Best feasible predicted step time so far (None until one is feasible)."""
    elapsed_s: float


ProgressCallback = Callable[[SearchProgress], None]


@dataclass
class Archive:
    """The best distinct candidates seen, sorted by score."""

    batch: CandidateBatch
    scores: np.ndarray
    labels: np.ndarray
    """How each row was made (object array of str)."""
    hashes: np.ndarray


class Evaluator:
    """Scores batches for one search and owns its budgets, its memory of what was seen, and its archive."""

    def __init__(
        self,
        context: SimContext,
        *,
        max_candidates: int,
        time_budget_s: float | None,
        archive_size: int,
        progress: ProgressCallback | None = None,
        started: float | None = None,
        reference_samples: float | None = None,
    ) -> None:
        self.context = context
        self.reference_samples = reference_samples
        """Samples the score is the time for (`normalized_step`); None: a data-parallel step's."""
        self.max_candidates = max_candidates
        self.time_budget_s = time_budget_s
        self.archive_size = archive_size
        self.progress = progress
        self.started = time.perf_counter() if started is None else started
        """perf_counter() when the budget started: the search's start, so set-up counts against it."""
        self.evaluated = 0
        self.by_phase: dict[str, int] = {}
        self.last_fresh = 0
        """Rows the last batch simulated that had not been seen before (0 once a small space is exhausted)."""
        self.archive: Archive | None = None
        self._seen: dict[int, float] = {}
        self._seconds_per_row: float | None = None
        self._last_end = self.started
        self._weights: dict[str, np.ndarray] = {}

    # --- budgets ---------------------------------------------------------------------------------

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    @property
    def remaining(self) -> int:
        return max(0, self.max_candidates - self.evaluated)

    @property
    def out_of_time(self) -> bool:
        return self.time_budget_s is not None and self.elapsed_s >= self.time_budget_s

    @property
    def exhausted(self) -> bool:
        return self.remaining == 0 or self.out_of_time

    def affordable(self, preferred: int) -> int:
        """How many rows the next batch may have so that, at the pace so far, it ends within the time
        budget and takes at most a tenth of it (so a slower-than-expected batch overshoots little);
        at least one; `preferred` when there is no time budget or no pace yet."""
        if self.time_budget_s is None or self._seconds_per_row is None:
            return preferred
        pace = max(self._seconds_per_row, 1e-9)
        left = self.time_budget_s - self.elapsed_s
        return int(max(1, min(preferred, 0.9 * left / pace, 0.1 * self.time_budget_s / pace)))

    def fraction_used(self) -> float:
        by_count = self.evaluated / max(self.max_candidates, 1)
        by_time = self.elapsed_s / self.time_budget_s if self.time_budget_s else 0.0
        return min(1.0, max(by_count, by_time))

    @property
    def best_score(self) -> float:
        return float(self.archive.scores[0]) if self.archive is not None and len(self.archive.scores) else INFEASIBLE

    # --- evaluation ------------------------------------------------------------------------------

    def evaluate(
        self, batch: CandidateBatch, labels: list[str] | np.ndarray, phase: str, *, force: bool = False
    ) -> np.ndarray:
        """Scores (`normalized_step`, inf when infeasible or left unevaluated) for every row.

        `force` evaluates every new row even past the candidate budget (the baselines always run).
        """
        if len(batch) == 0:
            return np.zeros(0, dtype=np.float64)
        hashes = self.row_hashes(batch)
        fresh = self._fresh_rows(hashes)
        if not force:
            fresh = fresh[: self.remaining]
        self.last_fresh = len(fresh)
        if len(fresh):
            taken = batch.take(fresh)
            result = simulate_batch(self.context, taken)
            fresh_scores = np.where(
                result.feasible,
                normalized_step(self.context, taken, result.step_time, self.reference_samples),
                INFEASIBLE,
            )
            self._seen.update(zip(hashes[fresh].tolist(), fresh_scores.tolist(), strict=True))
            self.evaluated += len(fresh)
            self.by_phase[phase] = self.by_phase.get(phase, 0) + len(fresh)
            self._remember(batch.take(fresh), fresh_scores, np.asarray(labels, dtype=object)[fresh], hashes[fresh])
        scores = np.array([self._seen.get(h, INFEASIBLE) for h in hashes.tolist()], dtype=np.float64)
        self._pace(0 if force else len(batch))
        self.report(phase)
        return scores

    def evaluate_in_pieces(
        self, batch: CandidateBatch, labels: list[str] | np.ndarray, phase: str, *, until_feasible: bool = False
    ) -> None:
        """`evaluate` in pieces the clock allows (`affordable`; FIRST_PIECE rows before the pace is known),
        so a large batch of rows that are slow to price (each new step size compiles its step's graph)
        stops at the time budget. `until_feasible` goes on past the clock while nothing found fits: a
        loaded machine must not turn "out of time" into "nothing fits"."""
        labels = np.asarray(labels, dtype=object)
        start = 0
        while start < len(batch) and (not self.exhausted or (until_feasible and self.needs_a_feasible_row)):
            size = self.affordable(len(batch) - start) if self._seconds_per_row is not None else FIRST_PIECE
            rows = np.arange(start, min(start + size, len(batch)))
            self.evaluate(batch.take(rows), labels[rows], phase)
            start = int(rows[-1]) + 1

    @property
    def needs_a_feasible_row(self) -> bool:
        """Nothing evaluated fits yet, and the candidate budget allows more."""
        return self.remaining > 0 and not np.isfinite(self.best_score)

    def _pace(self, rows: int) -> None:
        """Seconds per row, making and simulating included (time since the previous batch ended); forced
        batches (the baselines, built from Strategy objects) say nothing about the pace of the rest."""
        now = time.perf_counter()
        if rows:
            pace = (now - self._last_end) / rows
            self._seconds_per_row = pace if self._seconds_per_row is None else 0.5 * (self._seconds_per_row + pace)
        self._last_end = now

    def report(self, phase: str) -> None:
        if self.progress is not None:
            best = self.best_score
            self.progress(SearchProgress(phase, self.evaluated, None if np.isinf(best) else best, self.elapsed_s))

    def _fresh_rows(self, hashes: np.ndarray) -> np.ndarray:
        """Rows not simulated before, first occurrence only."""
        _, first = np.unique(hashes, return_index=True)
        first = np.sort(first)
        new = np.array([h not in self._seen for h in hashes[first].tolist()], dtype=bool)
        return first[new]

    def _remember(self, batch: CandidateBatch, scores: np.ndarray, labels: np.ndarray, hashes: np.ndarray) -> None:
        """Merge new rows into the archive: best first, at most PER_MIX rows per synchronizer mix, so that
        thousands of near-copies of one idea cannot push every other idea out."""
        good = np.isfinite(scores)
        if self.archive is not None and len(self.archive.scores) >= self.archive_size:
            good &= scores < self.archive.scores[-1]
        keep = np.flatnonzero(good)
        if len(keep) == 0:
            return
        if self.archive is not None:
            batch = CandidateBatch.concat(self.archive.batch, batch.take(keep))
            scores = np.concatenate([self.archive.scores, scores[keep]])
            labels = np.concatenate([self.archive.labels, labels[keep]])
            hashes = np.concatenate([self.archive.hashes, hashes[keep]])
        else:
            batch, scores, labels, hashes = batch.take(keep), scores[keep], labels[keep], hashes[keep]
        order = np.argsort(scores, kind="stable")
        order = order[_rank_within(self._hash(batch, MIX)[order]) < PER_MIX][: self.archive_size]
        self.archive = Archive(batch.take(order), scores[order], labels[order], hashes[order])

    # --- identity --------------------------------------------------------------------------------

    def row_hashes(self, batch: CandidateBatch) -> np.ndarray:
        """A 64-bit fingerprint per row: a random linear hash of every array (wrapping arithmetic)."""
        return self._hash(batch, tuple(DTYPES))

    def _hash(self, batch: CandidateBatch, names: tuple[str, ...]) -> np.ndarray:
        total = np.zeros(len(batch), dtype=np.uint64)
        for name in names:
            values = getattr(batch, name).reshape(len(batch), -1)
            if values.dtype == np.float32:
                values = values.view(np.uint32)
            weights = self._weights_for(name, values.shape[1])
            with np.errstate(over="ignore"):
                total += (values.astype(np.int64).astype(np.uint64) * weights[None, :]).sum(axis=1, dtype=np.uint64)
        return total

    def _weights_for(self, name: str, width: int) -> np.ndarray:
        weights = self._weights.get(name)
        if weights is None or len(weights) != width:
            seed = [_HASH_SEED, zlib.crc32(name.encode()), width]
            weights = np.random.default_rng(seed).integers(1, 2**63, size=width, dtype=np.uint64) | np.uint64(1)
            self._weights[name] = weights
        return weights


def _rank_within(keys: np.ndarray) -> np.ndarray:
    """For each position, how many earlier positions hold the same key (0 for the first occurrence)."""
    n = len(keys)
    by_key = np.argsort(keys, kind="stable")
    sorted_keys = keys[by_key]
    starts = np.concatenate([[True], sorted_keys[1:] != sorted_keys[:-1]]) if n else np.zeros(0, dtype=bool)
    first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    rank = np.empty(n, dtype=np.int64)
    rank[by_key] = np.arange(n) - first
    return rank
