"""The jobs list and the job page: what each shows, assembled from the database reads."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from models import Job, JobCandidate, StrategyRow
from optimizer_service.core.jobs import candidate_rows, relevelled_of, variants_of
from optimizer_service.dashboard import charts, queries
from optimizer_service.dashboard.progress import progress_of
from stratagem.errors import StratagemError
from stratagem.ir import ModelGraph, PredictedPerformance, ResourceSpec, Strategy

JOBS_SHOWN = 200


@dataclass(frozen=True)
class CandidateView:
    rank: int
    source: str
    strategy_id: str
    description: str
    predicted: PredictedPerformance | None
    measured_s: float | None
    trials: int
    relevelled_s: float | None = None
    """The prediction after the first trial re-levelled every candidate (None when nothing was re-levelled)."""
    variant_count: int = 0
    variants: tuple[dict[str, Any], ...] = ()

    @property
    def label(self) -> str:
        return f"#{self.rank} {self.source}"

    @property
    def error(self) -> float | None:
        """Relative error of the prediction against the measurement (0.1: 10% off)."""
        if self.predicted is None or self.measured_s is None:
            return None
        return abs(self.predicted.step_time_s - self.measured_s) / self.measured_s


def jobs_list_context(session: Session) -> dict[str, Any]:
    summaries, count = queries.list_jobs(session, limit=JOBS_SHOWN)
    rows = [{"summary": s, "progress": progress_of(s.job)} for s in summaries]
    return {"title": "Jobs", "rows": rows, "count": count, "shown": len(rows)}


def job_context(session: Session, job_id: uuid.UUID) -> dict[str, Any] | None:
    found = queries.get_job(session, job_id)
    if found is None:
        return None
    job, graph_row, resources_row = found
    result = job.result or {}
    candidates = _candidates(session, job)
    context: dict[str, Any] = {
        "title": f"Job {str(job.id)[:8]}",
        "job": job,
        "graph": {
            "id": graph_row.id,
            "name": graph_row.name,
            "layers": len(graph_row.json.get("layers", [])),
            "variables": len(graph_row.json.get("variables", [])),
            "batch_size": graph_row.json.get("batch_size"),
        },
        "cluster": {
            "id": resources_row.id,
            "name": resources_row.name,
            "devices": queries.count_devices(resources_row.json),
        },
        "progress": progress_of(job),
        "result": result,
        "search": result.get("search") or {},
        "decision": result.get("decision") or {},
        "relevel": result.get("relevel") or {},
        "current": result.get("current") or {},
        "candidates": candidates,
        "trial_count": sum(c.trials for c in candidates),
        "figures": {},
    }
    context["space"], context["space_note"] = _space(job, graph_row.json, resources_row.json)
    context["figures"] = _figures(candidates, context["space"])
    return context


def _candidates(session: Session, job: Job) -> list[CandidateView]:
    measured = queries.measured_by_strategy(session, job.id)
    result = job.result or {}
    return [_candidate_view(c, row, measured.get(row.id), result) for c, row in candidate_rows(session, job.id)]


def _candidate_view(
    candidate: JobCandidate, row: StrategyRow, trialled: tuple[float, int] | None, result: dict[str, Any]
) -> CandidateView:
    predicted = PredictedPerformance.model_validate(candidate.predicted) if candidate.predicted else None
    measured = (candidate.measured or {}).get("step_time_s")
    if trialled is not None:
        measured = min(trialled[0], measured) if measured else trialled[0]
    try:
        description = Strategy.parse(row.json).describe()
    except StratagemError as error:
        description = f"(unreadable strategy: {error})"
    return CandidateView(
        rank=candidate.rank,
        source=candidate.source,
        strategy_id=row.id,
        description=description,
        predicted=predicted,
        measured_s=measured,
        trials=trialled[1] if trialled else 0,
        relevelled_s=relevelled_of(result, row.id),
        variant_count=int(variants_of(result, row.id).get("count", 0)),
        variants=tuple(variants_of(result, row.id).get("listed", [])),
    )


def _space(job: Job, graph_json: dict[str, Any], resources_json: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The search's own count when the job has one; else counted now from the stored documents."""
    stored = ((job.result or {}).get("search") or {}).get("space")
    if isinstance(stored, dict) and "log10_candidates" in stored:
        return stored, "as counted by the job's search"
    try:
        from optimizer_service.search import SearchOptions, space_size
    except ImportError as error:
        return None, f"the strategy search is not installed in this service ({error})"
    search = (job.options or {}).get("search", {})
    options = SearchOptions(
        allow_compression=bool(search.get("allow_compression")), allow_async=bool(search.get("allow_async"))
    )
    try:
        size = space_size(ModelGraph.parse(graph_json), ResourceSpec.parse(resources_json), options)
    except StratagemError as error:
        return None, f"the space could not be counted: {error}"
    return size.model_dump(), "counted from the job's graph and cluster: the job's search has stored no count"


def _figures(candidates: list[CandidateView], space: dict[str, Any] | None) -> dict[str, charts.Figure]:
    figures: dict[str, charts.Figure] = {}
    predicted = [c for c in candidates if c.predicted is not None]
    if predicted:
        figures["breakdown"] = charts.breakdown_chart(
            [c.label for c in predicted], [c.predicted.breakdown for c in predicted if c.predicted]
        )
    if any(c.measured_s is not None for c in candidates):
        relevelled = [c.relevelled_s for c in candidates]
        figures["versus"] = charts.predicted_vs_measured_bars(
            [c.label for c in candidates],
            [c.predicted.step_time_s if c.predicted else None for c in candidates],
            [c.measured_s for c in candidates],
            relevelled=relevelled if any(r is not None for r in relevelled) else None,
        )
    if space and space.get("knobs"):
        figures["space"] = charts.space_chart({k: float(v) for k, v in space["knobs"].items()})
    return figures
