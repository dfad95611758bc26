"""Fold the ranks' reports into one TrialResult: the root-cause outcome and the step statistics."""

from __future__ import annotations

from datetime import UTC, datetime

from trial_runner.measure import median, quantile
from trial_runner.result import Outcome, RankReport, TrialResult
from trial_runner.spec import TrialSpec

_CAUSE_PRIORITY = {
    Outcome.invalid: 0,
    Outcome.oom: 1,
    Outcome.crash: 2,
    Outcome.killed: 3,
    Outcome.hang: 4,
    Outcome.timeout: 5,
}
"""A peer's echo of a failure (a closed connection) is a crash; the failure itself may be an OOM."""


def root_cause(reports: list[RankReport]) -> RankReport | None:
    """The failure that ended the trial: a rank's own error before a peer's echo of it, before a kill."""
    failed = [r for r in reports if r.outcome != Outcome.ok]
    if not failed:
        return None
    return min(failed, key=lambda r: (r.killed, r.peer_lost, _CAUSE_PRIORITY[r.outcome], r.finished_at or 0.0, r.rank))


def summarize(
    spec: TrialSpec, reports: list[RankReport], *, backend: str, started: datetime, finished: datetime
) -> TrialResult:
    cause = root_cause(reports)
    steps = _global_step_times(reports)
    middle = median(steps) if steps else None
    compute, wait, undistributed = _split(reports, middle)
    return TrialResult(
        outcome=cause.outcome if cause else Outcome.ok,
        error=f"rank {cause.rank}: {cause.error}" if cause else None,
        failed_rank=cause.rank if cause else None,
        world_size=spec.world_size,
        backend=backend,
        workload=spec.workload.label,
        strategy_id=spec.strategy.id,
        resources_id=spec.resources.id,
        global_batch_size=spec.global_batch_size,
        step_times_s=steps,
        median_s=middle,
        p90_s=quantile(steps, 0.9) if steps else None,
        samples_per_s=spec.global_batch_size / middle if middle else None,
        peak_memory_bytes=[r.peak_memory_bytes for r in reports],
        compute_s=compute,
        sync_wait_s=wait,
        undistributed_step_s=undistributed,
        optimizer_primed=bool(reports) and all(r.optimizer_primed for r in reports),
        ranks=reports,
        started_at=started.isoformat(),
        finished_at=finished.isoformat(),
        wall_s=max(0.0, (finished - started).total_seconds()),
    )


def now_utc() -> datetime:
    return datetime.now(UTC)


def _global_step_times(reports: list[RankReport]) -> list[float]:
    """Step i of the trial took as long as its slowest rank: the others wait for it in a collective."""
    counts = [len(r.step_times_s) for r in reports]
    if not counts or min(counts) == 0:
        return []
    return [max(r.step_times_s[i] for r in reports) for i in range(min(counts))]


def _per_rank_worst(reports: list[RankReport], values: list[list[float]]) -> float | None:
    """The slowest rank's median, only when every rank measured it."""
    if not reports or any(not v for v in values):
        return None
    return max(median(v) for v in values)


def _split(reports: list[RankReport], middle: float | None) -> tuple[float | None, float | None, float | None]:
    """(compute_s, sync_wait_s, undistributed_step_s), preferring what the runtime measured."""
    undistributed = _per_rank_worst(reports, [r.undistributed_times_s for r in reports])
    waits = [r.sync_wait_times_s for r in reports]
    if all(len(w) == len(r.step_times_s) and w for w, r in zip(waits, reports, strict=True)):
        wait = _per_rank_worst(reports, waits)
        busy = _per_rank_worst(
            reports, [[s - w for s, w in zip(r.step_times_s, r.sync_wait_times_s, strict=True)] for r in reports]
        )
        return busy, wait, undistributed
    if middle is None or undistributed is None:
        return None, None, undistributed
    return undistributed, max(0.0, middle - undistributed), undistributed
