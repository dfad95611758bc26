"""The strategy detail page: where every variable goes, what that costs, and who ranked or ran it.

A strategy's id covers only what executes, so one stored strategy can be a candidate of many jobs
with a different prediction in each; `?job=` picks whose prediction the page shows.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from models import JobCandidate
from optimizer_service.dashboard import charts, queries
from optimizer_service.dashboard.placement import Placement, placement
from stratagem.errors import StratagemError, UnsupportedStrategyError
from stratagem.interop.engines import ENGINES
from stratagem.ir import MeasuredPerformance, ModelGraph, PredictedPerformance, Strategy


def strategy_context(session: Session, strategy_id: str, job_id: uuid.UUID | None) -> dict[str, Any] | None:
    found = queries.get_strategy(session, strategy_id)
    if found is None:
        return None
    row, graph_row = found
    strategy = Strategy.parse(row.json)
    graph, graph_note = _graph(graph_row)
    candidate = queries.candidate_of(session, job_id, strategy_id) if job_id is not None else None
    predicted, measured = _annotations(strategy, candidate)
    fastest, trials_ok, trials = queries.trial_summary(session, strategy_id, job_id if candidate is not None else None)
    layout = placement(strategy, graph)
    return {
        "title": f"Strategy {strategy_id[:12]}",
        "strategy": strategy,
        "row": row,
        "graph_name": graph_row.name if graph_row else None,
        "graph_note": graph_note,
        "job_id": job_id if candidate is not None else None,
        "job_note": (
            f"job {job_id} does not rank this strategy, so it is shown on its own"
            if job_id is not None and candidate is None
            else None
        ),
        "source": candidate.source
        if candidate
        else strategy.provenance.builder or ("search" if strategy.provenance.search else None),
        "predicted": predicted,
        "measured": measured,
        "measured_s": min(filter(None, [fastest, measured.step_time_s if measured else None]), default=None),
        "trials": {"ok": trials_ok, "all": trials},
        "placement": layout,
        "rankings": queries.jobs_ranking(session, strategy_id),
        "figures": _figures(layout, predicted),
        "exports": _exports(strategy, graph),
        "layout_text": _layout_text(strategy, graph),
    }


EXPORT_LABELS = {
    "torchtitan": "torchtitan TOML",
    "deepspeed": "DeepSpeed JSON",
    "megatron": "Megatron-LM arguments",
    "accelerate": "Accelerate YAML",
}


def _exports(strategy: Strategy, graph: ModelGraph | None) -> list[dict[str, str | None]]:
    """Each trainer's download, or why that trainer cannot express the strategy (shown as a tooltip)."""
    out = []
    for engine in ENGINES:
        try:
            getattr(strategy, f"to_{engine}")(graph)
            reason = None
        except UnsupportedStrategyError as error:
            reason = str(error)
        out.append({"format": engine, "label": EXPORT_LABELS[engine], "reason": reason})
    return out


def _layout_text(strategy: Strategy, graph: ModelGraph | None) -> str | None:
    try:
        return str(strategy.layout(graph))
    except UnsupportedStrategyError:
        return None


def _annotations(
    strategy: Strategy, candidate: JobCandidate | None
) -> tuple[PredictedPerformance | None, MeasuredPerformance | None]:
    """The job's prediction and measurement when a job is given, else what the stored document carries."""
    if candidate is None:
        return strategy.predicted, strategy.measured
    predicted = PredictedPerformance.model_validate(candidate.predicted) if candidate.predicted else None
    measured = MeasuredPerformance.model_validate(candidate.measured) if candidate.measured else strategy.measured
    return predicted, measured


def _figures(layout: Placement, predicted: PredictedPerformance | None) -> dict[str, charts.Figure]:
    figures: dict[str, charts.Figure] = {}
    if layout.bytes_by_destination:
        figures["destinations"] = charts.destination_chart(layout.bytes_by_destination)
    if predicted is not None and predicted.breakdown:
        figures["breakdown"] = charts.breakdown_chart(
            ["this strategy"], [predicted.breakdown], title="Predicted cost breakdown"
        )
    return figures


def _graph(graph_row: Any) -> tuple[ModelGraph | None, str | None]:
    if graph_row is None:
        return None, "the graph this strategy was made for is not stored, so sizes are unknown"
    try:
        return ModelGraph.parse(graph_row.json), None
    except StratagemError as error:
        return None, f"the stored graph could not be read ({error}), so sizes are unknown"
