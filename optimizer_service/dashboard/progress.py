"""What a job's progress bar shows: the fraction of the current phase done and a line of text.

The job page's script (`static/dashboard.js`, `progressOf`) computes the same from `GET /v1/jobs/{id}`
every second; this is the server-side first paint and the jobs list. A search phase is done when
either of its budgets is spent (candidates or wall-clock), so the bar shows whichever is further.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from models import Job, JobPhase, JobStatus, utcnow


@dataclass(frozen=True)
class ProgressView:
    fraction: float
    """Of the current phase, 0 to 1."""
    text: str
    live: bool
    """Still queued or running: the page keeps polling."""


def progress_of(job: Job, now: datetime | None = None) -> ProgressView:
    progress: dict[str, Any] = job.progress or {}
    evaluated = int(progress.get("candidates_evaluated") or 0)
    if job.status.terminal:
        return _ended(job, evaluated, progress)
    if job.status == JobStatus.queued:
        return ProgressView(0.0, "queued: waiting for a worker", live=True)
    if job.phase == JobPhase.trials:
        done, budget = int(progress.get("trials_done") or 0), int(progress.get("trials_budget") or 0)
        return ProgressView(done / budget if budget else 0.0, f"trials: {done} of {budget} run", live=True)
    if job.phase == JobPhase.finalizing:
        return ProgressView(1.0, "finalizing: ranking and storing the answer", live=True)
    return _searching(job, evaluated, now or utcnow())


def _searching(job: Job, evaluated: int, now: datetime) -> ProgressView:
    search = (job.options or {}).get("search", {})
    budget_candidates = int(search.get("max_candidates") or 0)
    budget_s = float(search.get("time_budget_s") or 0.0)
    elapsed = (now - job.started_at).total_seconds() if job.started_at else 0.0
    by_count = evaluated / budget_candidates if budget_candidates else 0.0
    by_time = elapsed / budget_s if budget_s else 0.0
    fraction = min(1.0, max(by_count, by_time, 0.0))
    text = f"searching: {evaluated:,} of at most {budget_candidates:,} candidates, {min(elapsed, budget_s):.0f} of {budget_s:g} s"
    return ProgressView(fraction, text, live=True)


def _ended(job: Job, evaluated: int, progress: dict[str, Any]) -> ProgressView:
    if job.status == JobStatus.succeeded:
        trials = int(progress.get("trials_done") or 0)
        return ProgressView(1.0, f"done: {evaluated:,} candidates evaluated, {trials} trial(s)", live=False)
    return ProgressView(1.0, f"{job.status.value}: {job.error or 'no reason recorded'}", live=False)
