"""What one running app holds: its settings, database, workers and plug-ins.

Built by the app's lifespan, not at import time, so every `create_app` gets its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from optimizer_service.core.cost_model import CostModelTrainer
from optimizer_service.core.ingest import Ingestor
from optimizer_service.jobs.types import TrialExecutor
from optimizer_service.jobs.worker import WorkerPool
from optimizer_service.metrics import ServiceMetrics
from optimizer_service.settings import Settings


@dataclass
class ServiceState:
    settings: Settings
    metrics: ServiceMetrics
    cost_model_trainer: CostModelTrainer | None = None
    engine: Engine | None = None
    factory: sessionmaker[Session] | None = None
    workers: WorkerPool | None = field(default=None)
    owned_trials: TrialExecutor | None = None
    """The trial executor the app built from its settings (and must close), if any."""
    ingest: Ingestor | None = None
    """Parses, validates and acts on document-carrying request bodies off the event loop."""
