"""Trials: every real run of a strategy, successful or not, is a row the cost model can learn from."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, String, Text, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime, utcnow


class Trial(Base):
    __tablename__ = "trials"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    job_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), index=True)
    graph_id: Mapped[str] = mapped_column(ForeignKey("graphs.id"), index=True)
    resource_id: Mapped[str] = mapped_column(ForeignKey("resource_specs.id"))
    strategy_id: Mapped[str] = mapped_column(ForeignKey("strategies.id"), index=True)
    outcome: Mapped[str] = mapped_column(String(16))
    """`ok`, `oom`, `crash`, `timeout`, `hang` or `invalid` (trial_runner's outcomes)."""
    step_times_s: Mapped[list[float]] = mapped_column(JSON, default=list)
    median_s: Mapped[float | None] = mapped_column(Float)
    p90_s: Mapped[float | None] = mapped_column(Float)
    samples_per_s: Mapped[float | None] = mapped_column(Float)
    peak_memory_bytes: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    backend: Mapped[str] = mapped_column(String(32))
    predicted_step_time_s: Mapped[float | None] = mapped_column(Float)
    """What the simulator predicted when the trial ran, so its error can be studied later."""
    simulator_version: Mapped[str | None] = mapped_column(String(64))
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """The trial runner's full result (per-rank reports, compute/sync split) when it produced one."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
