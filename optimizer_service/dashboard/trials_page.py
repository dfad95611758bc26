"""The trials page: every measured run, filtered and sorted, and three charts over the same selection.

Filters and sort arrive as query parameters (so a view can be bookmarked and shared); a bad value is
reported with the parameter's name instead of being ignored.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy.orm import Session

from optimizer_service.dashboard import charts, queries
from optimizer_service.dashboard.knobs import Knobs, knobs_of
from stratagem.errors import StratagemError
from stratagem.ir import ModelGraph, Strategy
from trial_runner.result import Outcome

OUTCOMES = tuple(outcome.value for outcome in Outcome)
TABLE_ROWS = 200
CHART_TRIALS = 2000
CONTENT_ID = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class TrialQuery:
    where: queries.TrialFilter
    sort: queries.TrialSort
    descending: bool

    def link(self, **change: str) -> dict[str, str]:
        """The query parameters of this view with some changed (for the column headers)."""
        params = {
            "job": str(self.where.job_id or ""),
            "graph": self.where.graph_id or "",
            "outcome": self.where.outcome or "",
            "sort": self.sort,
            "order": "desc" if self.descending else "asc",
        }
        params.update(change)
        return {k: v for k, v in params.items() if v}


def parse_query(job: str, graph: str, outcome: str, sort: str, order: str) -> tuple[TrialQuery | None, list[str]]:
    problems = []
    job_id = None
    if job:
        try:
            job_id = uuid.UUID(job)
        except ValueError:
            problems.append(f"query.job: {job!r} is not a job id (a UUID)")
    if graph and not CONTENT_ID.match(graph):
        problems.append(f"query.graph: {graph!r} is not a graph id (64 hex digits)")
    if outcome and outcome not in OUTCOMES:
        problems.append(f"query.outcome: {outcome!r} is not one of {', '.join(OUTCOMES)}")
    if sort not in queries.TRIAL_SORTS:
        problems.append(f"query.sort: {sort!r} is not one of {', '.join(queries.TRIAL_SORTS)}")
    if order not in ("asc", "desc"):
        problems.append(f"query.order: {order!r} is not 'asc' or 'desc'")
    if problems:
        return None, problems
    where = queries.TrialFilter(job_id=job_id, graph_id=graph or None, outcome=outcome or None)
    return TrialQuery(where=where, sort=cast(queries.TrialSort, sort), descending=order == "desc"), []


def trials_context(session: Session, query: TrialQuery) -> dict[str, Any]:
    rows, count = queries.list_trials(
        session, query.where, sort=query.sort, descending=query.descending, limit=TABLE_ROWS
    )
    jobs, graphs = queries.trial_filter_choices(session)
    charted = queries.measured_in_time_order(session, query.where, limit=CHART_TRIALS)
    figures, mape, chart_note = _figures(session, charted)
    return {
        "title": "Trials",
        "query": query,
        "rows": rows,
        "count": count,
        "job_choices": jobs,
        "graph_choices": graphs,
        "outcomes": OUTCOMES,
        "figures": figures,
        "mape": mape,
        "chart_note": chart_note,
        "charted": len(charted),
    }


def _figures(
    session: Session, ok: list[queries.MeasuredTrial]
) -> tuple[dict[str, charts.Figure], float | None, str | None]:
    if not ok:
        return {}, None, None
    labels = {t.id: _label(t) for t in ok}
    figures: dict[str, charts.Figure] = {
        "over_time": charts.step_time_over_time(
            [charts.plot_time(t.created_at) for t in ok], [t.median_s for t in ok], [labels[t.id] for t in ok]
        ),
    }
    paired = [t for t in ok if t.predicted_step_time_s is not None]
    mape = None
    if paired:
        predicted, measured = [float(t.predicted_step_time_s or 0) for t in paired], [t.median_s for t in paired]
        mape = charts.mape(predicted, measured)
        figures["versus"] = charts.predicted_vs_measured_scatter(predicted, measured, [labels[t.id] for t in paired])
    knobs, times, skipped = _knobs(session, ok)
    if knobs:
        figures["knobs"] = charts.knobs_parcoords(knobs, times)
    note = (
        f"{skipped} trial(s) left out of the knobs chart: their strategy or graph could not be read"
        if skipped
        else None
    )
    return figures, mape, note


def _knobs(session: Session, trials: list[queries.MeasuredTrial]) -> tuple[list[Knobs], list[float], int]:
    """Each trial's strategy knobs, parsing every distinct strategy and graph once."""
    strategy_rows = queries.strategies_by_id(session, {t.strategy_id for t in trials})
    graph_rows = queries.graphs_by_id(session, {t.graph_id for t in trials})
    graphs: dict[str, ModelGraph | None] = {}
    cache: dict[tuple[str, str], Knobs | None] = {}
    knobs, times, skipped = [], [], 0
    for trial in trials:
        key = (trial.strategy_id, trial.graph_id)
        if key not in cache:
            cache[key] = _knobs_of(strategy_rows.get(trial.strategy_id), graph_rows.get(trial.graph_id), graphs)
        value = cache[key]
        if value is None:
            skipped += 1
            continue
        knobs.append(value)
        times.append(trial.median_s)
    return knobs, times, skipped


def _knobs_of(strategy_row: Any, graph_row: Any, graphs: dict[str, ModelGraph | None]) -> Knobs | None:
    if strategy_row is None or graph_row is None:
        return None
    try:
        if graph_row.id not in graphs:
            graphs[graph_row.id] = ModelGraph.parse(graph_row.json)
        graph = graphs[graph_row.id]
        return knobs_of(Strategy.parse(strategy_row.json), graph) if graph is not None else None
    except StratagemError:
        graphs.setdefault(graph_row.id, None)
        return None


def _label(trial: queries.MeasuredTrial) -> str:
    return f"trial {str(trial.id)[:8]} · strategy {trial.strategy_id[:8]} · {trial.backend}"
