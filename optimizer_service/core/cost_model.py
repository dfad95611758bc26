"""Cost-model versions, and the seam where a trainer plugs in.

The learned correction is trained elsewhere (`simulator.learned`); the service only needs something
that turns recorded trials into a JSON model. Until one is configured, retraining answers 503.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from models import CostModelVersion, GraphRow, ResourceSpecRow, StrategyRow, Trial, utcnow
from optimizer_service.core.errors import rejected, unavailable
from stratagem.ir import ModelGraph, ResourceSpec, Strategy


@dataclass(frozen=True)
class TrialSample:
    """One successful trial with everything a trainer needs to turn it into features."""

    graph: ModelGraph
    resources: ResourceSpec
    strategy: Strategy
    measured_step_time_s: float
    predicted_step_time_s: float | None
    group: str
    """Job id (or the trial's own id for trials recorded outside a job): the cross-validation group."""


@dataclass(frozen=True)
class TrainedCostModel:
    model_json: str
    """The whole model as one JSON document (XGBoost's JSON for the boosters): never a pickle."""
    n_train: int
    version: str
    metrics: dict[str, Any] = field(default_factory=dict)


class CostModelTrainer(Protocol):
    def train(self, samples: Sequence[TrialSample]) -> TrainedCostModel: ...


def list_versions(session: Session, *, limit: int, offset: int) -> tuple[list[CostModelVersion], int]:
    count = session.scalar(select(func.count()).select_from(CostModelVersion)) or 0
    rows = session.scalars(select(CostModelVersion).order_by(CostModelVersion.id.desc()).limit(limit).offset(offset))
    return list(rows), count


def version_in_use(session: Session) -> CostModelVersion | None:
    return session.scalars(select(CostModelVersion).where(CostModelVersion.in_use.is_(True)).order_by(CostModelVersion.id.desc())).first()


def retrain(session: Session, trainer: CostModelTrainer | None) -> CostModelVersion:
    """Train on every successful trial and make the new version the one in use."""
    if trainer is None:
        raise unavailable("no cost model trainer configured")
    samples = training_samples(session)
    if not samples:
        raise rejected("no successful trials recorded yet: nothing to train on", status=409)
    trained = trainer.train(samples)
    session.execute(update(CostModelVersion).values(in_use=False))
    version = CostModelVersion(
        version=trained.version[:64], booster=trained.model_json, n_train=trained.n_train,
        metrics=trained.metrics, in_use=True, created_at=utcnow(),
    )
    session.add(version)
    session.commit()
    return version


def training_samples(session: Session) -> list[TrialSample]:
    rows = session.execute(
        select(Trial, GraphRow, ResourceSpecRow, StrategyRow)
        .join(GraphRow, GraphRow.id == Trial.graph_id)
        .join(ResourceSpecRow, ResourceSpecRow.id == Trial.resource_id)
        .join(StrategyRow, StrategyRow.id == Trial.strategy_id)
        .where(Trial.outcome == "ok", Trial.median_s.is_not(None))
        .order_by(Trial.created_at)
    )
    graphs: dict[str, ModelGraph] = {}
    specs: dict[str, ResourceSpec] = {}
    samples = []
    for trial, graph_row, resources_row, strategy_row in rows:
        graph = graphs.setdefault(graph_row.id, ModelGraph.parse(graph_row.json))
        resources = specs.setdefault(resources_row.id, ResourceSpec.parse(resources_row.json))
        samples.append(
            TrialSample(
                graph=graph,
                resources=resources,
                strategy=Strategy.parse(strategy_row.json),
                measured_step_time_s=float(trial.median_s or 0.0),
                predicted_step_time_s=trial.predicted_step_time_s,
                group=str(trial.job_id or trial.id),
            )
        )
    return samples
