"""The app factory: `create_app(settings)` builds a fresh service; nothing is built at import time.

Start-up (the lifespan) connects to the database, migrates it to the newest schema (under an
advisory lock on PostgreSQL, so replicas do not race) and starts the worker threads; shutdown hands
running jobs back to the queue and closes the connections. The expensive collaborators (the search,
the trial executor, the cost-model trainer, even the pipeline) can be injected, which is how tests
run the real service around a fast or fake part.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from enum import Enum
from typing import Literal

import anyio
from fastapi import FastAPI
from pydantic import BaseModel

import migrations
import stratagem
from optimizer_service import dashboard
from optimizer_service.api import errors, routes
from optimizer_service.api.bodies import openapi_with_bodies
from optimizer_service.api.middleware import BodyLimitMiddleware, RequestContextMiddleware
from optimizer_service.api.schemas import OptimizeRequest, PredictRequest, TrialCreate
from optimizer_service.core.cost_model import CostModelTrainer, default_trainer
from optimizer_service.core.ingest import Ingestor
from optimizer_service.core.redact import install_log_masking
from optimizer_service.db import make_engine, make_session_factory
from optimizer_service.jobs.runner import Pipeline
from optimizer_service.jobs.search_adapter import SearchFn
from optimizer_service.jobs.trials import make_trial_executor
from optimizer_service.jobs.types import TrialExecutor
from optimizer_service.jobs.worker import WorkerPool
from optimizer_service.metrics import ServiceMetrics
from optimizer_service.settings import Settings
from optimizer_service.state import ServiceState
from stratagem.ir import ModelGraph, ResourceSpec

log = logging.getLogger(__name__)

DESCRIPTION = """Finds the fastest distributed-training strategy for a model on a cluster.

POST a ModelGraph and a ResourceSpec to `/v1/optimize`, follow the job at `/v1/jobs/{id}`, and fetch
the answer, a Strategy document, from `/v1/jobs/{id}/best`."""


class _Unset(Enum):
    """A default that tells "not given" apart from None (None means no trials)."""

    UNSET = "unset"


_UNSET = _Unset.UNSET
REQUEST_BODIES: list[type[BaseModel]] = [ModelGraph, ResourceSpec, OptimizeRequest, TrialCreate, PredictRequest]
"""Bodies the routes read off the event loop (`api/bodies.py`); listed so the OpenAPI document shows them."""
ROUTERS = (
    routes.graphs,
    routes.resources,
    routes.jobs,
    routes.strategies,
    routes.predict,
    routes.trials,
    routes.cost_model,
    routes.health,
)


def create_app(
    settings: Settings | None = None,
    *,
    search: SearchFn | None = None,
    trials: TrialExecutor | Literal[_Unset.UNSET] | None = _UNSET,
    cost_model_trainer: CostModelTrainer | None = None,
    pipeline: Pipeline | None = None,
) -> FastAPI:
    """A new app; `trials` left unset means the executor the settings ask for (None: no trials).

    `cost_model_trainer` left None means the learned cost model (`default_trainer`) unless the
    settings turn it off."""
    install_log_masking()
    settings = settings or Settings()
    trainer = cost_model_trainer if cost_model_trainer is not None else default_trainer(settings)
    state = ServiceState(settings=settings, metrics=ServiceMetrics(lambda: state.factory), cost_model_trainer=trainer)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(_start, state, search, trials, pipeline)
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(_stop, state)

    app = FastAPI(
        title="Stratagem",
        version=stratagem.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        separate_input_output_schemas=False,
    )
    app.state.stratagem = state
    errors.install(app)
    for module in ROUTERS:
        app.include_router(module.router)
    app.include_router(dashboard.router)
    # FastAPI's documented way to extend the schema is to replace the method on the instance.
    app.openapi = lambda: openapi_with_bodies(app, REQUEST_BODIES)  # type: ignore[method-assign]
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestContextMiddleware, metrics=state.metrics)  # outermost: ids and the catch-all
    return app


def _start(
    state: ServiceState,
    search: SearchFn | None,
    trials: TrialExecutor | Literal[_Unset.UNSET] | None,
    pipeline: Pipeline | None,
) -> None:
    settings = state.settings
    engine = make_engine(settings.database_url)
    if settings.run_migrations:
        migrations.upgrade(engine)
    state.engine, state.factory = engine, make_session_factory(engine)
    state.ingest = Ingestor(settings)
    executor = make_trial_executor(settings) if trials is _UNSET else trials
    if trials is _UNSET:
        state.owned_trials = executor  # made here, so closed here (a Ray it started is shut down)
    if settings.workers > 0:
        state.workers = WorkerPool(
            state.factory,
            settings,
            pipeline=pipeline,
            search=search,
            trials=executor,
            cost_model_trainer=state.cost_model_trainer,
        )
        state.workers.start()
    log.info(
        "stratagem service started: database %s, %d worker(s), trials %s",
        engine.url.render_as_string(hide_password=True),
        settings.workers,
        settings.effective_trials_backend,
    )


def _stop(state: ServiceState) -> None:
    if state.workers is not None:
        state.workers.stop()
    if state.ingest is not None:
        state.ingest.close()
    close = getattr(state.owned_trials, "close", None)
    if callable(close):
        close()
    if state.engine is not None:
        state.engine.dispose()
