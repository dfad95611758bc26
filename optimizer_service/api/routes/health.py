"""`/healthz` for load balancers and compose healthchecks, `/metrics` for Prometheus."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

import stratagem
from optimizer_service.api.deps import StateDep
from optimizer_service.api.schemas import HealthPublic

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)


@router.get("/healthz", response_model=HealthPublic, responses={503: {"model": HealthPublic}})
def healthz(state: StateDep) -> JSONResponse:
    database = "ok"
    try:
        if state.engine is None:
            raise RuntimeError("not connected")
        with state.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as error:  # any failure to reach the database is what this endpoint reports
        log.warning("health check: database unreachable: %s", error)
        database = f"unreachable: {type(error).__name__}"
    health = HealthPublic(
        status="ok" if database == "ok" else "degraded",
        database=database,
        workers=state.workers.size if state.workers is not None else 0,
        version=stratagem.__version__,
    )
    return JSONResponse(health.model_dump(), status_code=200 if database == "ok" else 503)


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(state: StateDep) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
