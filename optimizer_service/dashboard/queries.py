"""Every database read the dashboard makes, in one place and read-only.

Pages get plain rows and small dataclasses from here; nothing in this module writes, commits or
calls the API over HTTP. Lists are capped (`limit`), because a page that loads every trial of a
busy service would be slow long before anyone could read it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeVarTuple

from sqlalchemy import Select, SQLColumnExpression, func, select
from sqlalchemy.orm import Session, defer

from models import CostModelVersion, GraphRow, Job, JobCandidate, ResourceSpecRow, StrategyRow, Trial

TrialSort = Literal["created", "outcome", "measured", "predicted", "error", "backend"]
TRIAL_SORTS: tuple[TrialSort, ...] = ("created", "outcome", "measured", "predicted", "error", "backend")


@dataclass(frozen=True)
class JobSummary:
    """One line of the jobs list: the job and what the list shows about it."""

    job: Job
    graph_name: str
    cluster_name: str
    num_devices: int
    best_predicted_s: float | None
    best_measured_s: float | None
    trials: int


@dataclass(frozen=True)
class TrialFilter:
    job_id: uuid.UUID | None = None
    graph_id: str | None = None
    outcome: str | None = None


@dataclass(frozen=True)
class TrialRow:
    trial: Trial
    graph_name: str


def count_devices(resources_json: dict[str, Any]) -> int:
    """Compute devices of a stored ResourceSpec (GPUs, or CPUs on a node without GPUs)."""
    total = 0
    for node in resources_json.get("nodes", []):
        gpus = node.get("gpus") or []
        total += len(gpus) if gpus else len(node.get("cpus") or [])
    return total


# --- jobs ----------------------------------------------------------------------------------------


def list_jobs(session: Session, *, limit: int) -> tuple[list[JobSummary], int]:
    rows = session.execute(
        select(Job, GraphRow.name, ResourceSpecRow.name, ResourceSpecRow.json)
        .join(GraphRow, GraphRow.id == Job.graph_id)
        .join(ResourceSpecRow, ResourceSpecRow.id == Job.resource_id)
        .order_by(Job.created_at.desc(), Job.id)
        .limit(limit)
    ).all()
    ids = [row[0].id for row in rows]
    predicted = _best_predicted(session, ids)
    measured, trials = _measured_by_job(session, ids)
    summaries = [
        JobSummary(
            job=job,
            graph_name=graph_name,
            cluster_name=cluster_name,
            num_devices=count_devices(resources_json),
            best_predicted_s=predicted.get(job.id),
            best_measured_s=measured.get(job.id),
            trials=trials.get(job.id, 0),
        )
        for job, graph_name, cluster_name, resources_json in rows
    ]
    return summaries, session.scalar(select(func.count()).select_from(Job)) or 0


def _best_predicted(session: Session, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, float]:
    """The predicted step time of each job's answer (its best strategy), else of its rank-1 candidate."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(
            JobCandidate.job_id,
            JobCandidate.strategy_id,
            JobCandidate.rank,
            JobCandidate.predicted_step_time_s,
            Job.best_strategy_id,
        )
        .join(Job, Job.id == JobCandidate.job_id)
        .where(JobCandidate.job_id.in_(job_ids))
        .order_by(JobCandidate.rank)
    )
    best: dict[uuid.UUID, float] = {}
    for job_id, strategy_id, rank, step, best_id in rows:
        if step is None:
            continue
        if strategy_id == best_id or (rank == 1 and job_id not in best):
            best[job_id] = step
    return best


def _measured_by_job(session: Session, job_ids: list[uuid.UUID]) -> tuple[dict[uuid.UUID, float], dict[uuid.UUID, int]]:
    if not job_ids:
        return {}, {}
    fastest = session.execute(
        select(Trial.job_id, func.min(Trial.median_s))
        .where(Trial.job_id.in_(job_ids), Trial.outcome == "ok", Trial.median_s.is_not(None))
        .group_by(Trial.job_id)
    )
    counts = session.execute(select(Trial.job_id, func.count()).where(Trial.job_id.in_(job_ids)).group_by(Trial.job_id))
    return {job_id: float(t) for job_id, t in fastest if job_id is not None and t is not None}, {
        job_id: int(n) for job_id, n in counts if job_id is not None
    }


def get_job(session: Session, job_id: uuid.UUID) -> tuple[Job, GraphRow, ResourceSpecRow] | None:
    row = session.execute(
        select(Job, GraphRow, ResourceSpecRow)
        .join(GraphRow, GraphRow.id == Job.graph_id)
        .join(ResourceSpecRow, ResourceSpecRow.id == Job.resource_id)
        .where(Job.id == job_id)
    ).first()
    return (row[0], row[1], row[2]) if row is not None else None


def measured_by_strategy(session: Session, job_id: uuid.UUID) -> dict[str, tuple[float, int]]:
    """Per strategy of a job: the fastest median of its successful trials and how many trials ran."""
    rows = session.execute(select(Trial.strategy_id, Trial.outcome, Trial.median_s).where(Trial.job_id == job_id))
    fastest: dict[str, float] = {}
    counts: dict[str, int] = {}
    for strategy_id, outcome, median in rows:
        counts[strategy_id] = counts.get(strategy_id, 0) + 1
        if outcome == "ok" and median is not None:
            fastest[strategy_id] = min(median, fastest.get(strategy_id, median))
    return {sid: (fastest[sid], counts[sid]) for sid in fastest}


# --- strategies ----------------------------------------------------------------------------------


def get_strategy(session: Session, strategy_id: str) -> tuple[StrategyRow, GraphRow | None] | None:
    row = session.get(StrategyRow, strategy_id)
    if row is None:
        return None
    graph = session.get(GraphRow, row.graph_id) if row.graph_id else None
    return row, graph


def candidate_of(session: Session, job_id: uuid.UUID, strategy_id: str) -> JobCandidate | None:
    return session.scalars(
        select(JobCandidate).where(JobCandidate.job_id == job_id, JobCandidate.strategy_id == strategy_id)
    ).first()


def trial_summary(session: Session, strategy_id: str, job_id: uuid.UUID | None) -> tuple[float | None, int, int]:
    """(fastest successful median, successful trials, all trials) of a strategy, in one job or in all."""
    query = select(Trial.outcome, Trial.median_s).where(Trial.strategy_id == strategy_id)
    if job_id is not None:
        query = query.where(Trial.job_id == job_id)
    rows = session.execute(query).all()
    medians = [median for outcome, median in rows if outcome == "ok" and median is not None]
    return (min(medians) if medians else None), len(medians), len(rows)


def jobs_ranking(session: Session, strategy_id: str, *, limit: int = 50) -> list[tuple[uuid.UUID, int, str]]:
    """(job id, rank, source) of the jobs that ranked this strategy, newest first."""
    rows = session.execute(
        select(JobCandidate.job_id, JobCandidate.rank, JobCandidate.source)
        .join(Job, Job.id == JobCandidate.job_id)
        .where(JobCandidate.strategy_id == strategy_id)
        .order_by(Job.created_at.desc())
        .limit(limit)
    )
    return [(job_id, rank, source) for job_id, rank, source in rows]


# --- trials --------------------------------------------------------------------------------------


_Columns = TypeVarTuple("_Columns")


def _filtered(query: Select[*_Columns], where: TrialFilter) -> Select[*_Columns]:
    if where.job_id is not None:
        query = query.where(Trial.job_id == where.job_id)
    if where.graph_id is not None:
        query = query.where(Trial.graph_id == where.graph_id)
    if where.outcome is not None:
        query = query.where(Trial.outcome == where.outcome)
    return query


def _sort_key(sort: TrialSort) -> SQLColumnExpression[Any]:
    error = func.abs(Trial.predicted_step_time_s - Trial.median_s) / Trial.median_s
    columns: dict[str, SQLColumnExpression[Any]] = {
        "created": Trial.created_at,
        "outcome": Trial.outcome,
        "measured": Trial.median_s,
        "predicted": Trial.predicted_step_time_s,
        "error": error,
        "backend": Trial.backend,
    }
    return columns[sort]


def list_trials(
    session: Session, where: TrialFilter, *, sort: TrialSort, descending: bool, limit: int
) -> tuple[list[TrialRow], int]:
    key = _sort_key(sort)
    order = (key.desc() if descending else key.asc()).nulls_last()
    query = _filtered(
        select(Trial, GraphRow.name)
        .join(GraphRow, GraphRow.id == Trial.graph_id)
        .options(defer(Trial.step_times_s), defer(Trial.details)),
        where,
    )
    rows = session.execute(query.order_by(order, Trial.created_at.desc(), Trial.id).limit(limit))
    count = session.scalar(_filtered(select(func.count()).select_from(Trial), where)) or 0
    return [TrialRow(trial=trial, graph_name=name) for trial, name in rows], count


@dataclass(frozen=True)
class MeasuredTrial:
    """A successful trial, reduced to what the charts plot."""

    id: uuid.UUID
    strategy_id: str
    graph_id: str
    backend: str
    median_s: float
    predicted_step_time_s: float | None
    created_at: datetime


def measured_in_time_order(session: Session, where: TrialFilter, *, limit: int) -> list[MeasuredTrial]:
    """The newest `limit` successful matching trials, oldest first (for charts over time)."""
    columns = (
        Trial.id,
        Trial.strategy_id,
        Trial.graph_id,
        Trial.backend,
        Trial.median_s,
        Trial.predicted_step_time_s,
        Trial.created_at,
    )
    query = _filtered(select(*columns), where).where(Trial.outcome == "ok", Trial.median_s.is_not(None))
    rows = session.execute(query.order_by(Trial.created_at.desc(), Trial.id).limit(limit))
    trials = [
        MeasuredTrial(id_, strategy_id, graph_id, backend, median_s, predicted, created_at)
        for id_, strategy_id, graph_id, backend, median_s, predicted, created_at in rows
        if median_s is not None
    ]
    return sorted(trials, key=lambda t: t.created_at)


def strategies_by_id(session: Session, ids: set[str]) -> dict[str, StrategyRow]:
    if not ids:
        return {}
    return {row.id: row for row in session.scalars(select(StrategyRow).where(StrategyRow.id.in_(ids)))}


def graphs_by_id(session: Session, ids: set[str]) -> dict[str, GraphRow]:
    if not ids:
        return {}
    return {row.id: row for row in session.scalars(select(GraphRow).where(GraphRow.id.in_(ids)))}


def trial_filter_choices(
    session: Session, *, limit: int = 200
) -> tuple[list[tuple[uuid.UUID, str]], list[tuple[str, str]]]:
    """Jobs and graphs that have trials, for the filter menus: (id, label)."""
    jobs = session.execute(
        select(Job.id, GraphRow.name, Job.created_at)
        .join(GraphRow, GraphRow.id == Job.graph_id)
        .where(Job.id.in_(select(Trial.job_id).where(Trial.job_id.is_not(None)).distinct()))
        .order_by(Job.created_at.desc())
        .limit(limit)
    )
    graphs = session.execute(
        select(GraphRow.id, GraphRow.name)
        .where(GraphRow.id.in_(select(Trial.graph_id).distinct()))
        .order_by(GraphRow.name, GraphRow.id)
        .limit(limit)
    )
    return [(job_id, name) for job_id, name, _ in jobs], [(graph_id, name) for graph_id, name in graphs]


# --- cost model ----------------------------------------------------------------------------------


def cost_model_versions(session: Session, *, limit: int) -> list[CostModelVersion]:
    """Newest first, without the (large) model text."""
    return list(
        session.scalars(
            select(CostModelVersion)
            .options(defer(CostModelVersion.booster))
            .order_by(CostModelVersion.id.desc())
            .limit(limit)
        )
    )


def cost_model_version(session: Session, version_id: int) -> CostModelVersion | None:
    return session.scalars(
        select(CostModelVersion).options(defer(CostModelVersion.booster)).where(CostModelVersion.id == version_id)
    ).first()


def cost_model_text(session: Session, version_id: int) -> str | None:
    return session.scalar(select(CostModelVersion.booster).where(CostModelVersion.id == version_id))
