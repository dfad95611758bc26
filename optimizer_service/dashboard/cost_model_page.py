"""The cost-model page: the stored versions, and the scores and feature importances of one of them.

Scores are stored as the trainer's `metrics` dict: cross-validated by job, once for the simulator
alone and once corrected (`{"simulator": {...}, "corrected": {...}, "n_splits": k}`); a flat dict
of the same metric names is read as the corrected model's. Importances are not stored separately:
they are read from the model's own JSON (XGBoost boosters' total gain), so a version whose text does
not load says why instead of showing a chart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from models import CostModelVersion
from optimizer_service.dashboard import charts, queries

METRICS = {
    "mape": "MAPE (lower is better)",
    "log_error": "mean |log error| (lower is better)",
    "kendall_tau": "Kendall tau within a job (higher is better)",
    "top1_regret": "top-1 regret (lower is better)",
}
SHORT = {"mape": "MAPE", "log_error": "|log error|", "kendall_tau": "Kendall tau", "top1_regret": "top-1 regret"}
CHARTED = ("mape", "kendall_tau", "top1_regret")
VERSIONS_SHOWN = 100


@dataclass(frozen=True)
class MetricRow:
    key: str
    label: str
    simulator: float | None
    corrected: float | None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def metric_rows(metrics: dict[str, Any]) -> list[MetricRow]:
    nested = isinstance(metrics.get("corrected"), dict) or isinstance(metrics.get("simulator"), dict)
    simulator = metrics.get("simulator") if nested else {}
    corrected = metrics.get("corrected") if nested else metrics
    simulator = simulator if isinstance(simulator, dict) else {}
    corrected = corrected if isinstance(corrected, dict) else {}
    rows = [
        MetricRow(key, label, _number(simulator.get(key)), _number(corrected.get(key)))
        for key, label in METRICS.items()
    ]
    return [row for row in rows if row.simulator is not None or row.corrected is not None]


def headline(metrics: dict[str, Any], key: str) -> float | None:
    """The corrected model's value of one metric, for the versions table."""
    for row in metric_rows(metrics):
        if row.key == key:
            return row.corrected
    return None


def promotion(metrics: dict[str, Any]) -> dict[str, Any] | None:
    """The service's decision on putting the version in use (`simulator.learned.metrics.promotion`), if recorded."""
    decision = metrics.get("promotion")
    return decision if isinstance(decision, dict) and isinstance(decision.get("why"), str) else None


@dataclass(frozen=True)
class StoredModel:
    """What the page reads from a version's own JSON."""

    importances: dict[str, float]
    """Feature -> share of the boosters' total gain (empty when there is nothing to show)."""
    note: str | None
    """Why there are no importances, if there are none."""
    applied_share: float | None = None
    """The share of the fitted correction the model applies (its cross-validated `scale_`)."""
    place_levels: dict[str, float] = field(default_factory=dict)
    """Place (a trial backend) -> its level as a factor on the simulator, when trials came from several."""


def read_model(model_text: str | None) -> StoredModel:
    if not model_text:
        return StoredModel({}, "this version stores no model text")
    try:
        from simulator.learned import CostModel
    except ImportError as error:  # the learned model is an optional part of the service
        return StoredModel({}, f"the learned cost model is not installed in this service ({error})")
    try:
        model = CostModel.from_json(model_text)
        shares = model.feature_importance()
    except Exception as error:  # a stored model from another format version: say so, keep the page
        return StoredModel({}, f"the stored model could not be read: {type(error).__name__}: {error}")
    levels = {place: math.exp(level) for place, level in sorted(model.place_levels_.items())}
    if not model.boosters_:
        return StoredModel({}, "the model has no boosters (it was trained on no trials), so it is the simulator alone")
    if not shares:
        return StoredModel(
            {},
            "no tree splits on any feature yet (too few trials to learn more than a constant correction)",
            model.scale_,
            levels,
        )
    return StoredModel(shares, None, model.scale_, levels)


def cost_model_context(session: Session, version_id: int | None) -> dict[str, Any] | None:
    """None when `version_id` names no stored version."""
    versions = queries.cost_model_versions(session, limit=VERSIONS_SHOWN)
    selected = queries.cost_model_version(session, version_id) if version_id is not None else _current(versions)
    if version_id is not None and selected is None:
        return None
    context: dict[str, Any] = {
        "title": "Cost model",
        "versions": versions,
        "selected": selected,
        "metric_rows": [],
        "headline": {v.id: {k: headline(v.metrics or {}, k) for k in CHARTED} for v in versions},
        "kept_out": {v.id for v in versions if (promotion(v.metrics or {}) or {}).get("in_use") is False},
        "importance_note": None,
        "figures": {},
        "promotion": None,
        "applied_share": None,
        "place_levels": {},
    }
    if selected is None:
        return context
    rows = metric_rows(selected.metrics or {})
    stored = read_model(queries.cost_model_text(session, selected.id))
    charted = [row for row in rows if row.key in CHARTED]
    if charted:
        context["figures"]["metrics"] = charts.metrics_chart(
            [SHORT[r.key] for r in charted], [r.simulator for r in charted], [r.corrected for r in charted]
        )
    if stored.importances:
        context["figures"]["importance"] = charts.importance_chart(stored.importances)
    context.update(
        metric_rows=rows,
        importance_note=stored.note,
        promotion=promotion(selected.metrics or {}),
        applied_share=stored.applied_share,
        place_levels=stored.place_levels,
    )
    return context


def _current(versions: list[CostModelVersion]) -> CostModelVersion | None:
    """The version in use, else the newest."""
    return next((v for v in versions if v.in_use), versions[0] if versions else None)
