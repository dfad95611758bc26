"""Submitting, reading and cancelling jobs: the rules behind `/v1/optimize` and `/v1/jobs`.

A submission stores its documents (deduplicated) and the job in one transaction, and the queue limit
is enforced inside it: the transaction first takes the queue's lock (an advisory lock on PostgreSQL,
SQLite's write lock), then counts and inserts, so concurrent submissions on any number of replicas
never overfill the queue, and a refused one stores nothing. The options are stored resolved
(`JobOptions`, service defaults filled in), so a job states exactly what it ran with even if the
defaults change later.

A submission's `current` configuration is built against the graph and cluster before the queue's lock
is taken (building is CPU work; the lock is the database's): a layout that does not fit the cluster or
a strategy made for another graph is a 422 at `body.current.*`, and nothing is stored.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from models import Job, JobCandidate, JobStatus, StrategyRow, utcnow
from optimizer_service.core.documents import (
    get_graph_row,
    get_resources_row,
    load_graph,
    load_resources,
    store_graph,
    store_resources,
)
from optimizer_service.core.errors import document_rejected, not_found, queue_full, rejected
from optimizer_service.core.inputs import JobOptions, OptimizeInput, ProblemInput
from optimizer_service.settings import Settings
from stratagem.errors import InvalidDocumentError, UnsupportedStrategyError
from stratagem.ir import MeasuredPerformance, ModelGraph, PredictedPerformance, ResourceSpec, Strategy
from stratagem.layout import Layout

QUEUE_LOCK_KEY = 0x5354524151
"""PostgreSQL advisory lock that serializes submissions ("STRAQ"); not the migrations' key."""


def lock_queue(session: Session) -> None:
    """Hold the queue's lock until this session's transaction ends: count-then-insert is then atomic."""
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": QUEUE_LOCK_KEY})
    elif connection.dialect.name == "sqlite":
        # pysqlite opens transactions lazily, at the first write; take the write lock before the count instead.
        dbapi = connection.connection.dbapi_connection
        if dbapi is not None and not dbapi.in_transaction:
            connection.exec_driver_sql("BEGIN IMMEDIATE")


def submit_job(session: Session, request: OptimizeInput, settings: Settings) -> Job:
    options = JobOptions.resolve(request, settings, current=current_configuration(session, request))
    lock_queue(session)
    queued = session.scalar(select(func.count()).select_from(Job).where(Job.status == JobStatus.queued)) or 0
    if queued >= settings.max_queue_length:
        session.rollback()
        raise queue_full(queued, settings.max_queue_length, settings.retry_after_s)
    graph_id = _graph_id(session, request)
    resource_id = _resource_id(session, request)
    job = Job(
        id=uuid.uuid4(),
        graph_id=graph_id,
        resource_id=resource_id,
        options=options.model_dump(mode="json"),
        status=JobStatus.queued,
        progress={"trials_budget": options.max_trials},  # a waiting job shows 'trials 0/4', as the search will
        created_at=utcnow(),
    )
    session.add(job)
    session.commit()
    return job


def _graph_id(session: Session, request: OptimizeInput) -> str:
    if request.graph is not None:
        return store_graph(session, request.graph)[0].id
    return get_graph_row(session, str(request.graph_id), loc=["body", "graph_id"]).id


def _resource_id(session: Session, request: OptimizeInput) -> str:
    if request.resource_id is not None:
        return get_resources_row(session, request.resource_id, loc=["body", "resource_id"]).id
    resources = request.resources
    if isinstance(resources, str):
        resources = autodist_resources(resources, device=request.device)
    if resources is None:
        raise rejected("resources: give exactly one of 'resources' and 'resource_id'", loc=["body", "resources"])
    return store_resources(session, resources)[0].id


def current_configuration(session: Session, request: OptimizeInput) -> Layout | Strategy | None:
    """The request's `current` configuration, its short form parsed, checked by building it for the
    graph and cluster; problems are 422s at `body.current.*`."""
    if request.current is None:
        return None
    where: list[str | int] = ["body", "current"]
    try:
        current = Layout.from_string(request.current) if isinstance(request.current, str) else request.current
        graph, resources = graph_document(session, request), resources_document(session, request)
        if isinstance(current, Layout):
            current.build(graph, resources)
        else:
            current.validate_for(graph, resources)
    except InvalidDocumentError as error:
        raise document_rejected(error, where) from None
    except UnsupportedStrategyError as error:
        raise rejected(f"current: {error}", loc=where) from None
    return current


def graph_document(session: Session, request: ProblemInput) -> ModelGraph:
    """The request's graph: inline, or the stored one it names."""
    if request.graph is not None:
        return request.graph
    return load_graph(get_graph_row(session, str(request.graph_id), loc=["body", "graph_id"]))


def resources_document(session: Session, request: ProblemInput) -> ResourceSpec:
    """The request's cluster: inline, AutoDist YAML text read as such, or the stored one it names."""
    if request.resource_id is not None:
        return load_resources(get_resources_row(session, request.resource_id, loc=["body", "resource_id"]))
    if isinstance(request.resources, str):
        return autodist_resources(request.resources, device=request.device)
    if request.resources is None:
        raise rejected("resources: give exactly one of 'resources' and 'resource_id'", loc=["body", "resources"])
    return request.resources


def autodist_resources(text: str, *, device: str) -> ResourceSpec:
    """AutoDist resource_spec.yml text as a ResourceSpec; problems point into `body.resources`. The text is
    read as YAML and nothing else: a request never names a file on the server."""
    try:
        return ResourceSpec.from_autodist_text(text, device=device)
    except InvalidDocumentError as error:
        raise document_rejected(error, ["body", "resources"]) from None


def get_job(session: Session, job_id: uuid.UUID) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise not_found("job", job_id)
    return job


def list_jobs(session: Session, *, status: JobStatus | None, limit: int, offset: int) -> tuple[list[Job], int]:
    query = select(Job)
    count_query = select(func.count()).select_from(Job)
    if status is not None:
        query, count_query = query.where(Job.status == status), count_query.where(Job.status == status)
    jobs = session.scalars(query.order_by(Job.created_at.desc(), Job.id).limit(limit).offset(offset))
    return list(jobs), session.scalar(count_query) or 0


def cancel_job(session: Session, job_id: uuid.UUID) -> Job:
    """Queued jobs are cancelled at once; running ones are asked to stop at their next check."""
    now = utcnow()
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued)
        .values(
            status=JobStatus.cancelled,
            finished_at=now,
            error="cancelled on request before it started",
            cancel_requested=True,
        )
    )
    session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.running).values(cancel_requested=True))
    session.commit()
    job = get_job(session, job_id)
    session.refresh(job)
    return job


def job_candidates(session: Session, job_id: uuid.UUID) -> list[tuple[JobCandidate, StrategyRow]]:
    """A job's ranked candidates with their strategies; 404 when the job does not exist."""
    get_job(session, job_id)
    return candidate_rows(session, job_id)


def candidate_rows(session: Session, job_id: uuid.UUID) -> list[tuple[JobCandidate, StrategyRow]]:
    """A job's ranked candidates with their strategies, best first (none for an unknown job)."""
    rows = session.execute(
        select(JobCandidate, StrategyRow)
        .join(StrategyRow, StrategyRow.id == JobCandidate.strategy_id)
        .where(JobCandidate.job_id == job_id)
        .order_by(JobCandidate.rank)
    )
    return [(candidate, strategy) for candidate, strategy in rows]


def variants_of(result: dict[str, Any], strategy_id: str) -> dict[str, Any]:
    """A candidate's variants as its job recorded them (`{key, count, listed}`; empty when it has none)."""
    variants = (result.get("variants") or {}).get(strategy_id)
    return variants if isinstance(variants, dict) else {}


def relevelled_of(result: dict[str, Any], strategy_id: str) -> float | None:
    """A candidate's prediction after the job's first trial re-levelled it; None when nothing was re-levelled."""
    relevel = result.get("relevel") or {}
    if not relevel.get("applied"):
        return None
    value = (relevel.get("relevelled_s") or {}).get(strategy_id)
    return float(value) if isinstance(value, (int, float)) else None


def annotated_strategy(candidate: JobCandidate, row: StrategyRow) -> Strategy:
    """The stored strategy with this job's prediction and measurement (the id does not change)."""
    strategy = Strategy.parse(row.json)
    predicted = PredictedPerformance.model_validate(candidate.predicted) if candidate.predicted else None
    measured = MeasuredPerformance.model_validate(candidate.measured) if candidate.measured else None
    return strategy.model_copy(update={"predicted": predicted, "measured": measured})


def best_strategy(session: Session, job_id: uuid.UUID) -> Strategy:
    job = get_job(session, job_id)
    if job.status != JobStatus.succeeded or job.best_strategy_id is None:
        state = f"{job.status.value}" + (f": {job.error}" if job.error else "")
        # "yet" only while one may still come: a failed or cancelled job will never have one
        pending = job.status in (JobStatus.queued, JobStatus.running)
        raise rejected(
            f"job {job_id} has no answer {'yet' if pending else 'and will get none'} (it is {state})", status=409
        )
    for candidate, row in job_candidates(session, job_id):
        if row.id == job.best_strategy_id:
            return _with_notes(annotated_strategy(candidate, row), job)
    raise not_found("strategy", job.best_strategy_id)


def _with_notes(strategy: Strategy, job: Job) -> Strategy:
    summary = job.result or {}
    notes = [*strategy.provenance.notes, *[str(n) for n in summary.get("notes", [])]]
    notes.append(
        f"job {job.id}: answer basis {summary.get('answer_basis', 'predicted')}, {summary.get('trials_ok', 0)} of {summary.get('trials_ran', 0)} trials ok"
    )
    # The stored row is shared by every job that met this strategy; which cost model ranked it is this job's.
    provenance = strategy.provenance.model_copy(
        update={"notes": list(dict.fromkeys(notes)), "cost_model_version": summary.get("cost_model_version")}
    )
    return strategy.model_copy(update={"provenance": provenance})
