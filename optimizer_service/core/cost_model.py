"""Cost-model versions, the seam where a trainer plugs in, and when the service retrains.

The learned correction is trained elsewhere (`simulator.learned`); the service only needs something
that turns recorded trials into a JSON model. By default that is `LearnedCostModelTrainer`; with
`cost_model_enabled=False` and no injected trainer, retraining answers 503.

Every job's trials train one global model: a version is fitted on every successful trial in the
database, whichever job or user recorded it, so each job ranks with what all earlier jobs measured.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from models import CostModelVersion, GraphRow, ResourceSpecRow, StrategyRow, Trial, utcnow
from optimizer_service.core.errors import rejected, unavailable
from optimizer_service.jobs.correction import LoadedCostModel
from optimizer_service.jobs.queue import json_safe
from optimizer_service.settings import Settings
from simulator.learned import CostModel, Trainer, promotion, retrain_needed
from simulator.learned.records import default_group_id
from stratagem.errors import StratagemError
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialSample:
    """One successful trial with everything a trainer needs to turn it into features."""

    graph: ModelGraph
    resources: ResourceSpec
    strategy: Strategy
    measured_step_time_s: float
    predicted_step_time_s: float | None
    group: str
    """The cross-validation group: the problem (graph @ resources, `default_group_id`), not the job, so
    that a problem optimized twice, trials recorded outside a job and trials imported from another
    deployment (which arrive without their job) never put one strategy's measurements on both sides of
    a fold."""
    place: str
    """Where it was measured: the trial's backend, which names the trial runner here and the source of a
    trial imported from elsewhere (a published run names its paper or benchmark there)."""


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
    return session.scalars(
        select(CostModelVersion).where(CostModelVersion.in_use.is_(True)).order_by(CostModelVersion.id.desc())
    ).first()


def retrain(session: Session, trainer: CostModelTrainer | None) -> CostModelVersion:
    """Train on every successful trial and store the new version; it becomes the one in use when
    `promotion` allows, and otherwise the version in use (or the simulator alone) keeps serving, the
    reason kept in the version's metrics under `promotion`.

    The version's `created_at` is when its trials were read, so a trial recorded while it trained
    counts towards the next retraining.
    """
    if trainer is None:
        raise unavailable("no cost model trainer configured")
    started = utcnow()
    samples = training_samples(session)
    if not samples:
        raise rejected("no successful trials recorded yet: nothing to train on", status=409)
    trained = trainer.train(samples)
    serves, why = promotion(dict(trained.metrics))
    if serves:
        session.execute(update(CostModelVersion).values(in_use=False))
    else:
        log.warning("cost model %s not put in use: %s", trained.version, why)
    version = CostModelVersion(
        version=trained.version[:64],
        booster=trained.model_json,
        n_train=trained.n_train,
        metrics=json_safe({**trained.metrics, "promotion": {"in_use": serves, "why": why}}),
        in_use=serves,
        created_at=started,
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
                group=default_group_id(graph, resources),
                place=trial.backend,
            )
        )
    return samples


def trials_since_last_version(session: Session) -> int:
    """Successful trials recorded after the latest version was trained, in use or not (all of them when
    there is none), so a version that was not put in use does not make every new trial retrain."""
    query = select(func.count()).select_from(Trial).where(Trial.outcome == "ok", Trial.median_s.is_not(None))
    trained_at = session.scalar(select(CostModelVersion.created_at).order_by(CostModelVersion.id.desc()).limit(1))
    if trained_at is not None:
        query = query.where(Trial.created_at >= trained_at)
    return int(session.scalar(query) or 0)


def retrain_if_due(session: Session, trainer: CostModelTrainer, *, every: int) -> CostModelVersion | None:
    """Retrain once `every` successful trials arrived since the latest version; 0 never retrains."""
    if every <= 0:
        return None
    new_trials = trials_since_last_version(session)
    if not retrain_needed(new_trials, every):
        return None
    log.info("retraining the cost model: %d new successful trials (every %d)", new_trials, every)
    return retrain(session, trainer)


class LearnedCostModelTrainer:
    """The default trainer: `simulator.learned.Trainer` behind this module's protocol.

    The one place where the learned model's shapes meet the service's: samples go in as they are
    (they have every field the learned trainer reads), and its result comes back as a
    `TrainedCostModel` whose metrics also say how many trials the simulator refused.
    """

    def __init__(self, **params: Any) -> None:
        self._trainer = Trainer(**params)

    def train(self, samples: Sequence[TrialSample]) -> TrainedCostModel:
        trained = self._trainer.train(samples)
        if trained.n_train == 0:
            raise rejected(
                f"none of the {len(samples)} successful trials could be simulated again "
                "(their strategies no longer match their graph or cluster): nothing to train on",
                status=409,
            )
        return TrainedCostModel(
            model_json=trained.model_json,
            n_train=trained.n_train,
            version=trained.version,
            metrics={**trained.metrics, "skipped": trained.skipped},
        )


def default_trainer(settings: Settings) -> CostModelTrainer | None:
    """The trainer a service gets when none is injected: the learned model, unless turned off."""
    return LearnedCostModelTrainer() if settings.cost_model_enabled else None


class InUseCostModel:
    """The version in use, parsed once per version and shared by a pool's job threads.

    A version whose text is not a model this service can apply (another trainer's format, a newer
    format version) is logged once and ranks with the simulator alone, rather than failing jobs.
    """

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._loaded: tuple[int, LoadedCostModel | None] | None = None

    def current(self) -> LoadedCostModel | None:
        with self._factory() as session:
            row = session.execute(
                select(CostModelVersion.id, CostModelVersion.version)
                .where(CostModelVersion.in_use.is_(True))
                .order_by(CostModelVersion.id.desc())
                .limit(1)
            ).first()
            if row is None:
                return None
            with self._lock:
                if self._loaded is None or self._loaded[0] != row.id:
                    text = session.scalar(select(CostModelVersion.booster).where(CostModelVersion.id == row.id))
                    self._loaded = (row.id, _parse(row.version, text or ""))
                return self._loaded[1]


def _parse(version: str, text: str) -> LoadedCostModel | None:
    try:
        return LoadedCostModel(version=version, model=CostModel.from_json(text))
    except StratagemError as error:
        log.warning("cost model version %s cannot be applied (%s); jobs rank with the simulator alone", version, error)
        return None
