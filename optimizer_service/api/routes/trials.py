"""`/v1/trials`: every measured run, from this service's jobs or reported by clients."""

from __future__ import annotations

import uuid
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Query, Request

from models import Trial
from optimizer_service.api.bodies import ingested, json_body
from optimizer_service.api.deps import SessionDep, StateDep, WriteAuthDep, require_read_key
from optimizer_service.api.routes.documents_common import CONTENT_ID, Limit, Offset
from optimizer_service.api.schemas import ErrorPublic, TrialCreate, TrialPublic, TrialsPublic
from optimizer_service.core import trials as core
from optimizer_service.core.errors import not_found, unavailable
from optimizer_service.state import ServiceState

router = APIRouter(prefix="/v1/trials", tags=["trials"], dependencies=[Depends(require_read_key)])


def trial_public(trial: Trial) -> TrialPublic:
    return TrialPublic.model_validate(trial, from_attributes=True)


@router.get("")
def list_trials(
    session: SessionDep,
    job_id: uuid.UUID | None = None,
    graph_id: Annotated[str | None, Query(pattern=CONTENT_ID.pattern, description="Content id of a graph")] = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> TrialsPublic:
    trials, count = core.list_trials(session, job_id=job_id, graph_id=graph_id, limit=limit, offset=offset)
    return TrialsPublic(data=[trial_public(t) for t in trials], count=count)


@router.post("", status_code=201, openapi_extra=json_body(TrialCreate), responses={404: {"model": ErrorPublic}})
async def record_trial(request: Request, state: StateDep, _: WriteAuthDep) -> TrialPublic:
    """The body (a `TrialCreate`) is parsed, validated and stored off the event loop."""
    recorded = await ingested(state, "trial", request)
    return await anyio.to_thread.run_sync(_read_trial, state, uuid.UUID(recorded["id"]))


def _read_trial(state: ServiceState, trial_id: uuid.UUID) -> TrialPublic:
    if state.factory is None:
        raise unavailable("the database is not ready")
    with state.factory() as session:
        trial = session.get(Trial, trial_id)
        if trial is None:
            raise not_found("trial", trial_id)
        return trial_public(trial)


@router.get("/{trial_id}", responses={404: {"model": ErrorPublic}})
def get_trial(trial_id: uuid.UUID, session: SessionDep) -> TrialPublic:
    trial = session.get(Trial, trial_id)
    if trial is None:
        raise not_found("trial", trial_id)
    return trial_public(trial)
