"""Plain values the pipeline exchanges with the worker: progress and results out, interruptions typed.

The options going in are `optimizer_service.core.inputs.JobOptions`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from models import JobPhase, JobStatus
from stratagem.errors import StratagemError
from stratagem.ir import MeasuredPerformance, ModelGraph, ResourceSpec, Strategy
from trial_runner.result import Outcome


class Interruption(StrEnum):
    """Why a job stopped before its answer, and so what becomes of it."""

    requeue = "requeue"
    """The service is shutting down: the job goes back to the queue for another worker."""
    failed = "failed"
    """It cannot finish (time limit, no candidate, every trial failed)."""
    cancelled = "cancelled"
    """A client asked it to stop."""
    lost = "lost"
    """Another worker owns it now (this one was presumed dead): nothing is written."""

    @property
    def status(self) -> JobStatus | None:
        """The status the job is written with; None for a job this worker no longer owns."""
        return {
            Interruption.requeue: JobStatus.queued,
            Interruption.failed: JobStatus.failed,
            Interruption.cancelled: JobStatus.cancelled,
        }.get(self)


class JobInterrupted(StratagemError):
    """The job stopped on request, by its time limit, at shutdown, or because it was taken over."""

    def __init__(self, message: str, *, why: Interruption) -> None:
        super().__init__(message)
        self.why = why


@dataclass
class Progress:
    phase: JobPhase = JobPhase.queued
    candidates_evaluated: int = 0
    best_step_time_s: float | None = None
    trials_done: int = 0
    trials_budget: int = 0
    timings_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["phase"] = self.phase.value
        return data


@dataclass
class TrialRecord:
    """One trial as the database stores it, whatever its outcome."""

    strategy: Strategy
    outcome: Outcome
    backend: str
    step_times_s: list[float] = field(default_factory=list)
    median_s: float | None = None
    p90_s: float | None = None
    samples_per_s: float | None = None
    peak_memory_bytes: float | None = None
    error: str | None = None
    predicted_step_time_s: float | None = None
    simulator_version: str | None = None
    details: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.ok and self.median_s is not None and self.median_s > 0

    def measured(self) -> MeasuredPerformance | None:
        if not self.ok or self.median_s is None:
            return None
        return MeasuredPerformance(
            step_time_s=self.median_s,
            step_time_p90_s=self.p90_s,
            samples_per_s=self.samples_per_s or 0.0,
            peak_memory_bytes=self.peak_memory_bytes,
        )


@dataclass
class RankedCandidate:
    strategy: Strategy
    """With `predicted` set (and `measured` once a trial measured it)."""
    source: str
    rank: int = 0


@dataclass
class PipelineResult:
    candidates: list[RankedCandidate]
    """Ranked: fastest measured first when trials ran, then by predicted step time."""
    best: RankedCandidate
    trials: list[TrialRecord]
    summary: dict[str, Any]


class TrialExecutor(Protocol):
    """Runs one strategy for real; failures come back as records with an outcome, not exceptions."""

    backend: str

    def run(self, graph: ModelGraph, resources: ResourceSpec, strategy: Strategy) -> TrialRecord: ...


ProgressCallback = Callable[[Progress], None]
CancelCheck = Callable[[], bool]
