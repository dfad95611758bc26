"""Running one claimed job: load its documents, call the pipeline, persist the outcome.

Whatever happens inside the pipeline ends in exactly one terminal write: succeeded with the answer,
cancelled, failed with a message a user can read, or handed back to the queue when the service is
shutting down. The pipeline never sees the database; it sees a progress callback and a cancel check.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from models import GraphRow, Job, JobPhase, JobStatus, ResourceSpecRow
from optimizer_service.core.cost_model import InUseCostModel
from optimizer_service.core.documents import load_graph, load_resources
from optimizer_service.jobs import queue
from optimizer_service.jobs.correction import LoadedCostModel
from optimizer_service.jobs.pipeline import run_pipeline
from optimizer_service.jobs.search_adapter import SearchFn
from optimizer_service.jobs.types import JobInterrupted, PipelineOptions, Progress, TrialExecutor, TrialRecord
from stratagem.errors import StratagemError
from stratagem.ir import ModelGraph, ResourceSpec

log = logging.getLogger(__name__)

Pipeline = Callable[..., Any]


@dataclass
class JobContext:
    """What every job run by one worker pool shares."""

    factory: queue.Factory
    worker_id: str
    stopping: threading.Event
    job_timeout_s: float
    progress_interval_s: float
    pipeline: Pipeline = run_pipeline
    search: SearchFn | None = None
    trials: TrialExecutor | None = None
    cost_models: InUseCostModel | None = None
    """Where jobs find the cost model in use; None ranks with the simulator alone."""


class _Reporter:
    """Throttled progress writes and cancel checks for one job."""

    def __init__(self, context: JobContext, job_id: uuid.UUID, history: list[str] | None = None) -> None:
        self._context, self._job_id = context, job_id
        self._history = list(history or [])
        """Notes from earlier attempts (e.g. why the job was requeued), kept in front of this run's."""
        self._started = time.monotonic()
        self._last_write = float("-inf")
        self._last_phase: JobPhase | None = None
        self._cancel = False
        self._lost = False
        self.latest = Progress(phase=JobPhase.searching, notes=list(self._history))

    def progress(self, state: Progress) -> None:
        self.latest = replace(state, notes=[*self._history, *state.notes], timings_s=dict(state.timings_s))
        now = time.monotonic()
        if state.phase == self._last_phase and now - self._last_write < self._context.progress_interval_s:
            return
        self._last_write, self._last_phase = now, state.phase
        answer = queue.write_progress(self._context.factory, self._job_id, self._context.worker_id, self.latest)
        self._note(answer)

    def cancelled(self) -> bool:
        """True to stop; raises JobInterrupted for the time limit and for shutdown."""
        if self._context.stopping.is_set():
            raise JobInterrupted("the service is shutting down; the job goes back to the queue", status="queued")
        elapsed = time.monotonic() - self._started
        if elapsed > self._context.job_timeout_s:
            raise JobInterrupted(
                f"the job ran {elapsed:.0f} s, past its limit of {self._context.job_timeout_s:.0f} s", status="failed"
            )
        now = time.monotonic()
        if now - self._last_write >= self._context.progress_interval_s:
            self._last_write = now
            self._note(queue.cancel_requested(self._context.factory, self._job_id, self._context.worker_id))
        if self._lost:
            raise JobInterrupted("another worker took this job over", status="lost")
        return self._cancel

    def _note(self, answer: bool | None) -> None:
        if answer is None:
            self._lost = True
        else:
            self._cancel = self._cancel or answer


def execute_job(context: JobContext, job_id: uuid.UUID) -> JobStatus | None:
    """Run a claimed job to its end; returns the status written (None if the job was taken over)."""
    try:
        graph_id, resource_id, graph, resources, options, history = _load(context.factory, job_id)
    except StratagemError as error:
        reporter = _Reporter(context, job_id)
        return _finish(context, job_id, JobStatus.failed, f"the job's documents could not be read: {error}", reporter)

    reporter = _Reporter(context, job_id, history)

    def on_trial(record: TrialRecord) -> None:
        queue.record_trial(context.factory, job_id, graph_id, resource_id, record)

    try:
        result = context.pipeline(
            graph,
            resources,
            options,
            reporter.progress,
            reporter.cancelled,
            search=context.search,
            trials=context.trials,
            on_trial=on_trial,
            cost_model=_cost_model(context),
        )
    except JobInterrupted as stop:
        if stop.status == "lost":
            log.warning("job %s: %s", job_id, stop)
            return None
        return _finish(context, job_id, JobStatus(stop.status), str(stop), reporter)
    except StratagemError as error:
        return _finish(context, job_id, JobStatus.failed, f"{type(error).__name__}: {error}", reporter)
    except Exception as error:  # a bug or an unexpected failure in a dependency: the job fails, the worker lives
        log.exception("job %s failed unexpectedly", job_id)
        return _finish(context, job_id, JobStatus.failed, f"internal error ({type(error).__name__}): {error}", reporter)
    try:
        stored = queue.complete(context.factory, job_id, context.worker_id, result, reporter.latest)
    except Exception as error:  # the answer could not be stored: fail the job rather than leave it running
        log.exception("job %s: storing the result failed", job_id)
        return _finish(
            context,
            job_id,
            JobStatus.failed,
            f"internal error while storing the result ({type(error).__name__}): {error}",
            reporter,
        )
    if not stored:
        log.warning("job %s finished but another worker owns it now; result discarded", job_id)
        return None
    return JobStatus.succeeded


def _cost_model(context: JobContext) -> LoadedCostModel | None:
    """The version in use; if it cannot be read now, this job ranks with the simulator alone."""
    if context.cost_models is None:
        return None
    try:
        return context.cost_models.current()
    except Exception:  # the database hiccuped: a job without the correction beats a failed job
        log.exception("the cost model in use could not be loaded; ranking with the simulator alone")
        return None


def _finish(
    context: JobContext, job_id: uuid.UUID, status: JobStatus, error: str, reporter: _Reporter
) -> JobStatus | None:
    if status == JobStatus.queued:
        reporter.latest.notes.append(f"requeued: {error}")
    written = queue.finish_unsuccessfully(context.factory, job_id, context.worker_id, status, error, reporter.latest)
    return status if written else None


def _load(
    factory: queue.Factory, job_id: uuid.UUID
) -> tuple[str, str, ModelGraph, ResourceSpec, PipelineOptions, list[str]]:
    with factory() as session:
        job = session.get(Job, job_id)
        graph_row = session.get(GraphRow, job.graph_id) if job else None
        resources_row = session.get(ResourceSpecRow, job.resource_id) if job else None
        if job is None or graph_row is None or resources_row is None:
            raise StratagemError(f"job {job_id} or its documents are missing")
        history = [str(note) for note in (job.progress or {}).get("notes", [])]
        options = options_from_json(job.options)
        return job.graph_id, job.resource_id, load_graph(graph_row), load_resources(resources_row), options, history


def options_from_json(options: dict[str, Any]) -> PipelineOptions:
    search = options.get("search", {})
    return PipelineOptions(
        max_trials=int(options["max_trials"]),
        objective=str(options.get("objective", "throughput")),
        time_budget_s=float(search["time_budget_s"]),
        max_candidates=int(search["max_candidates"]),
        top_k=int(search["top_k"]),
        seed=int(search["seed"]),
        allow_compression=bool(search.get("allow_compression", False)),
        allow_async=bool(search.get("allow_async", False)),
    )
