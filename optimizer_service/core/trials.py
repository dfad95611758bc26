"""Trials recorded by clients (measured on their own clusters) and the paged trial listing."""

from __future__ import annotations

import statistics
import uuid

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models import Trial
from optimizer_service.core.documents import (
    get_graph_row,
    get_resources_row,
    get_strategy_row,
    load_graph,
    load_resources,
    load_strategy,
)
from optimizer_service.core.errors import document_rejected, not_found
from optimizer_service.core.inputs import TrialInput
from optimizer_service.core.jobs import get_job
from optimizer_service.jobs.queue import insert_trial
from optimizer_service.jobs.types import TrialRecord
from stratagem.errors import InvalidDocumentError, NotFoundError
from stratagem.ir import Strategy


def record_trial(session: Session, body: TrialInput) -> Trial:
    graph = load_graph(get_graph_row(session, body.graph_id, loc=["body", "graph_id"]))
    resources = load_resources(get_resources_row(session, body.resource_id, loc=["body", "resource_id"]))
    if body.job_id is not None:
        _require_job(session, body.job_id, loc=["body", "job_id"])
    strategy = _strategy(session, body)
    try:
        strategy.validate_for(graph, resources)
    except InvalidDocumentError as error:
        raise document_rejected(error, ["body", "strategy"]) from None
    record = _record(body, strategy, global_batch=graph.batch_size * strategy.effective_mesh.data)
    trial_id = insert_trial(session, body.job_id, graph.id or body.graph_id, resources.id or body.resource_id, record)
    session.commit()
    trial = session.get(Trial, trial_id)
    if trial is None:
        raise not_found("trial", trial_id)
    return trial


def _strategy(session: Session, body: TrialInput) -> Strategy:
    if body.strategy is not None:
        return body.strategy
    return load_strategy(get_strategy_row(session, str(body.strategy_id), loc=["body", "strategy_id"]))


def _record(body: TrialInput, strategy: Strategy, *, global_batch: int) -> TrialRecord:
    """Summaries a client left out are computed from its samples, the way trial_runner computes them."""
    times = sorted(body.step_times_s)
    median = body.median_s if body.median_s is not None else (statistics.median(times) if times else None)
    p90 = (
        body.p90_s if body.p90_s is not None else (times[min(len(times) - 1, int(0.9 * len(times)))] if times else None)
    )
    samples = body.samples_per_s if body.samples_per_s is not None else (global_batch / median if median else None)
    return TrialRecord(
        strategy=strategy,
        outcome=body.outcome,
        backend=body.backend,
        step_times_s=list(body.step_times_s),
        median_s=median,
        p90_s=p90,
        samples_per_s=samples,
        peak_memory_bytes=body.peak_memory_bytes,
        error=body.error,
        predicted_step_time_s=body.predicted_step_time_s,
        simulator_version=body.simulator_version,
    )


def _check_filters(session: Session, job_id: uuid.UUID | None, graph_id: str | None) -> None:
    """A filter naming nothing stored is a typo far more often than a question: 404, not an empty page."""
    if job_id is not None:
        _require_job(session, job_id, loc=["query", "job_id"])
    if graph_id is not None:
        get_graph_row(session, graph_id, loc=["query", "graph_id"])


def _require_job(session: Session, job_id: uuid.UUID, *, loc: list[str | int]) -> None:
    """A 404 that names where the client gave the job id (`get_job`'s own names no field)."""
    try:
        get_job(session, job_id)
    except NotFoundError:
        raise not_found("job", job_id, loc=loc) from None


def list_trials(
    session: Session, *, job_id: uuid.UUID | None, graph_id: str | None, limit: int, offset: int
) -> tuple[list[Trial], int]:
    _check_filters(session, job_id, graph_id)
    query = select(Trial)
    count_query = select(func.count()).select_from(Trial)
    if job_id is not None:
        query, count_query = query.where(Trial.job_id == job_id), count_query.where(Trial.job_id == job_id)
    if graph_id is not None:
        query, count_query = query.where(Trial.graph_id == graph_id), count_query.where(Trial.graph_id == graph_id)
    trials = session.scalars(query.order_by(Trial.created_at.desc(), Trial.id).limit(limit).offset(offset))
    return list(trials), session.scalar(count_query) or 0
