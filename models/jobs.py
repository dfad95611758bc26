"""Optimization jobs and their ranked candidates.

Jobs live in the database rather than in a worker's memory, so any replica's worker can claim one,
and a job whose worker died is found by its stale heartbeat and requeued or failed.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, Boolean, Enum, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime, utcnow


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


class JobPhase(StrEnum):
    queued = "queued"
    searching = "searching"
    trials = "trials"
    finalizing = "finalizing"
    done = "done"


def _enum(kind: type[StrEnum]) -> Enum:
    """Stored as a plain string (no native ENUM type), so adding a value needs no migration on PostgreSQL."""
    return Enum(
        kind, native_enum=False, create_constraint=False, length=16, values_callable=lambda e: [m.value for m in e]
    )


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status_created_at", "status", "created_at"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    graph_id: Mapped[str] = mapped_column(ForeignKey("graphs.id"), index=True)
    resource_id: Mapped[str] = mapped_column(ForeignKey("resource_specs.id"))
    options: Mapped[dict[str, Any]] = mapped_column(JSON)
    """The validated optimize options (objective, trial budget, search budgets) as submitted."""
    status: Mapped[JobStatus] = mapped_column(_enum(JobStatus), default=JobStatus.queued)
    phase: Mapped[JobPhase] = mapped_column(_enum(JobPhase), default=JobPhase.queued)
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Summary of the answer: speed-ups, whether trials ran, notes for the user."""
    error: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    """How many times a worker claimed the job; bounds requeueing after crashed workers."""
    worker_id: Mapped[str | None] = mapped_column(String(120))
    best_strategy_id: Mapped[str | None] = mapped_column(ForeignKey("strategies.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class JobCandidate(Base):
    """One ranked strategy of a job: what the simulator predicted and, if trialled, what was measured."""

    __tablename__ = "job_candidates"
    __table_args__ = (UniqueConstraint("job_id", "strategy_id", name="uq_job_candidates_job_id_strategy_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    strategy_id: Mapped[str] = mapped_column(ForeignKey("strategies.id"))
    rank: Mapped[int] = mapped_column(Integer)
    predicted: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    measured: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    predicted_step_time_s: Mapped[float | None] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(120))
    """`search` or the builder that made it (`AllReduce`, `Parallax`, ...)."""
