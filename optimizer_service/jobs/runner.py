"""Running one claimed job: load its documents, call the pipeline, persist the outcome.

Whatever happens inside the pipeline ends in exactly one terminal write: succeeded with the answer,
cancelled, failed with a message a user can read, or handed back to the queue when the service is
shutting down. The pipeline never sees the database; it sees a progress callback and a cancel check.

A job that was claimed before (its worker died or the service restarted) resumes: the trials it
recorded are handed to the pipeline, which counts them against the budget and runs only the rest.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select

from models import GraphRow, Job, JobPhase, JobStatus, ResourceSpecRow, StrategyRow, Trial
from optimizer_service.core.cost_model import InUseCostModel
from optimizer_service.core.documents import load_graph, load_resources, load_trace
from optimizer_service.core.inputs import JobOptions
from optimizer_service.core.redact import public_text
from optimizer_service.jobs import queue
from optimizer_service.jobs.correction import LoadedCostModel
from optimizer_service.jobs.pipeline import run_pipeline
from optimizer_service.jobs.search_adapter import SearchFn
from optimizer_service.jobs.types import Interruption, JobInterrupted, Progress, TrialExecutor, TrialRecord
from stratagem.errors import StratagemError
from stratagem.ir import ModelGraph, ResourceSpec, Strategy
from trial_runner.result import Outcome

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
        notes = list(dict.fromkeys([*self._history, *state.notes]))  # a resumed run repeats no earlier note
        self.latest = replace(state, notes=notes, timings_s=dict(state.timings_s))
        now = time.monotonic()
        if state.phase == self._last_phase and now - self._last_write < self._context.progress_interval_s:
            return
        self._last_write, self._last_phase = now, state.phase
        answer = queue.write_progress(self._context.factory, self._job_id, self._context.worker_id, self.latest)
        self._note(answer)

    def cancelled(self) -> bool:
        """True to stop; raises JobInterrupted for the time limit and for shutdown."""
        if self._context.stopping.is_set():
            raise JobInterrupted(
                "the service is shutting down; the job goes back to the queue", why=Interruption.requeue
            )
        elapsed = time.monotonic() - self._started
        if elapsed > self._context.job_timeout_s:
            raise JobInterrupted(
                f"the job ran {elapsed:.0f} s, past its limit of {self._context.job_timeout_s:.0f} s",
                why=Interruption.failed,
            )
        now = time.monotonic()
        if now - self._last_write >= self._context.progress_interval_s:
            self._last_write = now
            self._note(queue.cancel_requested(self._context.factory, self._job_id, self._context.worker_id))
        if self._lost:
            raise JobInterrupted("another worker took this job over", why=Interruption.lost)
        return self._cancel

    def _note(self, answer: bool | None) -> None:
        if answer is None:
            self._lost = True
        else:
            self._cancel = self._cancel or answer


def execute_job(context: JobContext, job_id: uuid.UUID) -> JobStatus | None:
    """Run a claimed job to its end; returns the status written (None if the job was taken over)."""
    try:
        loaded = _load(context.factory, job_id)
    except StratagemError as error:
        reporter = _Reporter(context, job_id)
        return _finish(context, job_id, JobStatus.failed, f"the job's documents could not be read: {error}", reporter)

    reporter = _Reporter(context, job_id, loaded.history)

    def on_trial(record: TrialRecord) -> None:
        if not queue.record_trial(
            context.factory, job_id, context.worker_id, loaded.graph_id, loaded.resource_id, record
        ):
            raise JobInterrupted("another worker took this job over", why=Interruption.lost)

    try:
        result = context.pipeline(
            loaded.graph,
            loaded.resources,
            loaded.options,
            reporter.progress,
            reporter.cancelled,
            search=context.search,
            trials=_owned_trials(context.trials, job_id, resumed=loaded.attempts > 1),
            on_trial=on_trial,
            cost_model=_cost_model(context),
            recorded=loaded.recorded,
        )
    except JobInterrupted as stop:
        status = stop.why.status
        if status is None:
            log.warning("job %s: %s", job_id, stop)
            return None
        return _finish(context, job_id, status, str(stop), reporter)
    except StratagemError as error:
        return _finish(context, job_id, JobStatus.failed, public_text(f"{type(error).__name__}: {error}"), reporter)
    except Exception as error:  # a bug or an unexpected failure in a dependency: the job fails, the worker lives
        log.exception("job %s failed unexpectedly", job_id)
        message = f"internal error ({type(error).__name__}): {error}"
        return _finish(context, job_id, JobStatus.failed, public_text(message), reporter)
    try:
        stored = queue.complete(context.factory, job_id, context.worker_id, result, reporter.latest)
    except Exception as error:  # the answer could not be stored: fail the job rather than leave it running
        log.exception("job %s: storing the result failed", job_id)
        return _finish(
            context,
            job_id,
            JobStatus.failed,
            public_text(f"internal error while storing the result ({type(error).__name__}): {error}"),
            reporter,
        )
    if not stored:
        log.warning("job %s finished but another worker owns it now; result discarded", job_id)
        return None
    return JobStatus.succeeded


class _OwnedTrials:
    """The pool's trial executor with this job as the owner of every worker it starts."""

    def __init__(self, inner: Any, owner: str) -> None:
        self._inner, self._owner = inner, owner
        self.backend: str = inner.backend

    def workload_note(self, graph: ModelGraph) -> str | None:
        describe = getattr(self._inner, "workload_note", None)
        return describe(graph) if callable(describe) else None

    def run(self, graph: ModelGraph, resources: ResourceSpec, strategy: Strategy) -> TrialRecord:
        return self._inner.run(graph, resources, strategy, owner=self._owner)  # type: ignore[no-any-return]


def _owned_trials(trials: TrialExecutor | None, job_id: uuid.UUID, *, resumed: bool) -> TrialExecutor | None:
    """Trials owned by the job, when the executor can name owners; a resumed job first kills what an
    earlier attempt's crashed service left running (Ray actors; local ranks die with their service)."""
    if trials is None or not callable(getattr(trials, "reap", None)):
        return trials
    owner = str(job_id)
    if resumed:
        try:
            killed = trials.reap(owner)  # type: ignore[attr-defined]
        except Exception:  # the cluster is unreachable: the job's own trials will say so
            log.exception("job %s: could not look for an earlier attempt's trial workers", job_id)
        else:
            if killed:
                log.warning("job %s: killed %d trial worker(s) left by an earlier attempt", job_id, killed)
    return _OwnedTrials(trials, owner)


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


@dataclass
class _Loaded:
    graph_id: str
    resource_id: str
    graph: ModelGraph
    resources: ResourceSpec
    options: JobOptions
    history: list[str]
    """Notes from earlier attempts."""
    recorded: list[TrialRecord]
    """Trials earlier attempts of this job recorded, oldest first."""
    attempts: int


def _load(factory: queue.Factory, job_id: uuid.UUID) -> _Loaded:
    with factory() as session:
        job = session.get(Job, job_id)
        graph_row = session.get(GraphRow, job.graph_id) if job else None
        resources_row = session.get(ResourceSpecRow, job.resource_id) if job else None
        if job is None or graph_row is None or resources_row is None:
            raise StratagemError(f"job {job_id} or its documents are missing")
        history = [str(note) for note in (job.progress or {}).get("notes", [])]
        graph = load_graph(graph_row)
        trace = load_trace(session, graph)
        if trace is not None:
            graph.attach_trace(trace)
        return _Loaded(
            graph_id=job.graph_id,
            resource_id=job.resource_id,
            graph=graph,
            resources=load_resources(resources_row),
            options=JobOptions.model_validate(job.options),
            history=history,
            recorded=_recorded_trials(session, job_id),
            attempts=job.attempts,
        )


def _recorded_trials(session: Any, job_id: uuid.UUID) -> list[TrialRecord]:
    """What earlier attempts of the job measured, as the pipeline's records (none for a first attempt)."""
    rows = session.execute(
        select(Trial, StrategyRow)
        .join(StrategyRow, StrategyRow.id == Trial.strategy_id)
        .where(Trial.job_id == job_id)
        .order_by(Trial.created_at, Trial.id)
    )
    return [
        TrialRecord(
            strategy=Strategy.parse(strategy.json),
            outcome=Outcome(trial.outcome),
            backend=trial.backend,
            step_times_s=list(trial.step_times_s or []),
            median_s=trial.median_s,
            p90_s=trial.p90_s,
            samples_per_s=trial.samples_per_s,
            peak_memory_bytes=trial.peak_memory_bytes,
            error=trial.error,
            predicted_step_time_s=trial.predicted_step_time_s,
            simulator_version=trial.simulator_version,
        )
        for trial, strategy in rows
    ]
