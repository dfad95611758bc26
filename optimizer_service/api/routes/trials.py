"""`/v1/trials`: every measured run, from this service's jobs or reported by clients."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from models import Trial
from optimizer_service.api.deps import SessionDep, WriteAuthDep, require_read_key
from optimizer_service.api.routes.documents_common import CONTENT_ID, Limit, Offset
from optimizer_service.api.schemas import ErrorPublic, TrialCreate, TrialPublic, TrialsPublic
from optimizer_service.core import trials as core
from optimizer_service.core.errors import not_found

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


@router.post("", status_code=201, responses={404: {"model": ErrorPublic}})
def record_trial(body: TrialCreate, session: SessionDep, _: WriteAuthDep) -> TrialPublic:
    return trial_public(core.record_trial(session, body))


@router.get("/{trial_id}", responses={404: {"model": ErrorPublic}})
def get_trial(trial_id: uuid.UUID, session: SessionDep) -> TrialPublic:
    trial = session.get(Trial, trial_id)
    if trial is None:
        raise not_found("trial", trial_id)
    return trial_public(trial)
