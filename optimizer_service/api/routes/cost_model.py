"""`/v1/cost-model`: the learned cost model's versions and metrics, and retraining."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from models import CostModelVersion
from optimizer_service.api.deps import SessionDep, StateDep, WriteAuthDep, require_read_key
from optimizer_service.api.routes.documents_common import Limit, Offset
from optimizer_service.api.schemas import CostModelPublic, CostModelVersionPublic, ErrorPublic
from optimizer_service.core import cost_model as core

router = APIRouter(prefix="/v1/cost-model", tags=["cost model"], dependencies=[Depends(require_read_key)])


def version_public(row: CostModelVersion) -> CostModelVersionPublic:
    return CostModelVersionPublic.model_validate(row, from_attributes=True)


@router.get("")
def cost_model(session: SessionDep, state: StateDep, limit: Limit = 50, offset: Offset = 0) -> CostModelPublic:
    """The version in use is read before the listing: a retraining that commits between the two reads
    then adds a row to the listing rather than naming a version the listing lacks."""
    in_use = core.version_in_use(session)
    rows, count = core.list_versions(session, limit=limit, offset=offset)
    return CostModelPublic(
        data=[version_public(row) for row in rows],
        count=count,
        in_use=in_use.id if in_use else None,
        trainer_configured=state.cost_model_trainer is not None,
    )


@router.post(
    "/retrain",
    status_code=201,
    responses={409: {"model": ErrorPublic, "description": "No trials to train on"}, 503: {"model": ErrorPublic}},
)
def retrain(session: SessionDep, state: StateDep, _: WriteAuthDep) -> CostModelVersionPublic:
    return version_public(core.retrain(session, state.cost_model_trainer))
