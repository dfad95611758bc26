"""The job queue is the `jobs` table: claiming, heartbeats, progress, completion and recovery.

Claiming is safe with any number of workers and replicas on one database. On PostgreSQL a worker
selects the oldest queued job `FOR UPDATE SKIP LOCKED`, so concurrent claimers never wait on or take
the same row. SQLite has no row locks; there the claim is an `UPDATE ... WHERE status = 'queued'`
on the chosen id, which only one writer can win. Every later write by a worker is conditional on
`worker_id` and `status = 'running'`, so a worker that was presumed dead (and whose job was requeued)
cannot overwrite the new owner's work.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, Update, select, update
from sqlalchemy.orm import Session, sessionmaker

from models import Job, JobCandidate, JobPhase, JobStatus, Trial, utcnow
from optimizer_service.core.documents import store_strategy
from optimizer_service.jobs.types import PipelineResult, Progress, TrialRecord

log = logging.getLogger(__name__)

Factory = sessionmaker[Session]


@dataclass(frozen=True)
class Claim:
    job_id: uuid.UUID
    attempt: int


def claim_next(factory: Factory, worker_id: str) -> Claim | None:
    with factory.begin() as session:
        if session.get_bind().dialect.name == "postgresql":
            return _claim_locked(session, worker_id)
        return _claim_conditional(session, worker_id)


def _claim_locked(session: Session, worker_id: str) -> Claim | None:
    job = session.scalars(
        select(Job)
        .where(Job.status == JobStatus.queued)
        .order_by(Job.created_at, Job.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    ).first()
    if job is None:
        return None
    now = utcnow()
    job.status, job.phase, job.worker_id, job.started_at, job.heartbeat_at = (
        JobStatus.running,
        JobPhase.searching,
        worker_id,
        now,
        now,
    )
    job.attempts += 1
    return Claim(job.id, job.attempts)


def _claim_conditional(session: Session, worker_id: str) -> Claim | None:
    for _ in range(5):
        job_id = session.scalar(
            select(Job.id).where(Job.status == JobStatus.queued).order_by(Job.created_at, Job.id).limit(1)
        )
        if job_id is None:
            return None
        now = utcnow()
        claimed = _updated(
            session,
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.queued)
            .values(
                status=JobStatus.running,
                phase=JobPhase.searching,
                worker_id=worker_id,
                started_at=now,
                heartbeat_at=now,
                attempts=Job.attempts + 1,
            ),
        )
        if claimed == 1:
            attempts = session.scalar(select(Job.attempts).where(Job.id == job_id))
            return Claim(job_id, int(attempts or 1))
    return None


def _owned(job_id: uuid.UUID, worker_id: str) -> Any:
    return (Job.id == job_id) & (Job.worker_id == worker_id) & (Job.status == JobStatus.running)


def heartbeat(factory: Factory, job_ids: list[uuid.UUID], worker_id: str) -> None:
    if not job_ids:
        return
    with factory.begin() as session:
        session.execute(
            update(Job)
            .where(Job.id.in_(job_ids), Job.worker_id == worker_id, Job.status == JobStatus.running)
            .values(heartbeat_at=utcnow())
        )


def write_progress(factory: Factory, job_id: uuid.UUID, worker_id: str, progress: Progress) -> bool | None:
    """Persist progress (and a heartbeat); returns whether cancellation was requested, None if no longer ours."""
    with factory.begin() as session:
        written = _updated(
            session,
            update(Job)
            .where(_owned(job_id, worker_id))
            .values(progress=json_safe(progress.to_json()), phase=progress.phase, heartbeat_at=utcnow()),
        )
        if written != 1:
            return None
        return bool(session.scalar(select(Job.cancel_requested).where(Job.id == job_id)))


def cancel_requested(factory: Factory, job_id: uuid.UUID, worker_id: str) -> bool | None:
    with factory() as session:
        row = session.execute(select(Job.cancel_requested, Job.worker_id, Job.status).where(Job.id == job_id)).first()
    if row is None or row.worker_id != worker_id or row.status != JobStatus.running:
        return None
    return bool(row.cancel_requested)


def record_trial(
    factory: Factory, job_id: uuid.UUID, worker_id: str, graph_id: str, resource_id: str, record: TrialRecord
) -> bool:
    """Store a job's trial in the transaction that confirms the job is still this worker's; False if not.

    The confirming write (a heartbeat) locks the job's row first, so a worker presumed dead whose job
    went to another cannot add trials beside the new owner's: a job never holds more than its budget."""
    with factory.begin() as session:
        owned = _updated(session, update(Job).where(_owned(job_id, worker_id)).values(heartbeat_at=utcnow()))
        if owned != 1:
            return False
        insert_trial(session, job_id, graph_id, resource_id, record)
        return True


def insert_trial(
    session: Session, job_id: uuid.UUID | None, graph_id: str, resource_id: str, record: TrialRecord
) -> uuid.UUID:
    store_strategy(session, record.strategy, graph_id=graph_id, resource_id=resource_id)
    trial = Trial(
        id=uuid.uuid4(),
        job_id=job_id,
        graph_id=graph_id,
        resource_id=resource_id,
        strategy_id=record.strategy.id,
        outcome=record.outcome.value,
        step_times_s=list(record.step_times_s),
        median_s=record.median_s,
        p90_s=record.p90_s,
        samples_per_s=record.samples_per_s,
        peak_memory_bytes=record.peak_memory_bytes,
        error=record.error,
        backend=record.backend,
        predicted_step_time_s=record.predicted_step_time_s,
        simulator_version=record.simulator_version,
        details=json_safe(record.details),
        created_at=utcnow(),
    )
    session.add(trial)
    session.flush()
    return trial.id


def json_safe(value: Any) -> Any:
    """Plain JSON for a JSON column: non-finite floats become None (PostgreSQL's json refuses NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def complete(factory: Factory, job_id: uuid.UUID, worker_id: str, result: PipelineResult, progress: Progress) -> bool:
    """Store the ranked candidates and the answer in one transaction; False if the job is no longer ours."""
    with factory.begin() as session:
        job = session.scalars(select(Job).where(_owned(job_id, worker_id))).first()
        if job is None:
            return False
        for candidate in result.candidates:
            strategy = candidate.strategy
            store_strategy(session, strategy, graph_id=job.graph_id, resource_id=job.resource_id)
            session.add(
                JobCandidate(
                    job_id=job.id,
                    strategy_id=strategy.id,
                    rank=candidate.rank,
                    predicted=strategy.predicted.model_dump(mode="json") if strategy.predicted else None,
                    measured=strategy.measured.model_dump(mode="json") if strategy.measured else None,
                    predicted_step_time_s=strategy.predicted.step_time_s if strategy.predicted else None,
                    source=candidate.source[:120],
                )
            )
        progress.phase = JobPhase.done
        job.status, job.phase, job.progress = JobStatus.succeeded, JobPhase.done, json_safe(progress.to_json())
        job.result, job.best_strategy_id, job.error = json_safe(result.summary), result.best.strategy.id, None
        job.finished_at = job.heartbeat_at = utcnow()
        return True


def finish_unsuccessfully(
    factory: Factory, job_id: uuid.UUID, worker_id: str, status: JobStatus, error: str, progress: Progress
) -> bool:
    """End a job as failed or cancelled, or hand it back to the queue (status queued)."""
    values: dict[str, Any] = {
        "status": status,
        "error": error[:20_000],
        "progress": json_safe(progress.to_json()),
        "heartbeat_at": utcnow(),
    }
    if status == JobStatus.queued:
        values |= {"worker_id": None, "phase": JobPhase.queued, "started_at": None}
    else:
        values |= {"finished_at": utcnow(), "phase": progress.phase}
    with factory.begin() as session:
        return _updated(session, update(Job).where(_owned(job_id, worker_id)).values(**values)) == 1


def recover_stale(factory: Factory, *, stale_after_s: float, max_attempts: int) -> dict[str, int]:
    """Requeue (or, past `max_attempts`, fail) running jobs whose worker stopped heartbeating."""
    cutoff = utcnow() - timedelta(seconds=stale_after_s)
    counts = {"requeued": 0, "failed": 0}
    with factory.begin() as session:
        query = select(Job).where(Job.status == JobStatus.running, Job.heartbeat_at < cutoff)
        if session.get_bind().dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=True)
        for job in session.scalars(query):
            seen = job.heartbeat_at.isoformat() if job.heartbeat_at else "never"
            lost = f"worker {job.worker_id} stopped heartbeating (last at {seen}, attempt {job.attempts} of {max_attempts})"
            notes = list((job.progress or {}).get("notes", []))
            if job.attempts < max_attempts:
                job.status, job.phase, job.worker_id, job.started_at = JobStatus.queued, JobPhase.queued, None, None
                job.progress = {**(job.progress or {}), "notes": [*notes, f"requeued: {lost}"]}
                counts["requeued"] += 1
            else:
                job.status, job.finished_at = JobStatus.failed, utcnow()
                job.error = f"the job was not finished: {lost}; giving up after {job.attempts} attempts"
                counts["failed"] += 1
            log.warning("stale job %s: %s -> %s", job.id, lost, job.status.value)
    return counts


def _updated(session: Session, statement: Update) -> int:
    """The rows an UPDATE matched: `Session.execute` is typed to return a `Result`, but for DML it returns
    a `CursorResult`, which carries the count."""
    return cast(CursorResult[Any], session.execute(statement)).rowcount
