"""`/v1/resources`: upload (deduplicated by content id), list and fetch ResourceSpec documents."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from models import ResourceSpecRow
from optimizer_service.api.bodies import json_body, uploaded
from optimizer_service.api.deps import SessionDep, StateDep, WriteAuthDep, require_read_key
from optimizer_service.api.routes.documents_common import Limit, Offset, checked_id, resources_summary
from optimizer_service.api.schemas import ErrorPublic, ResourceSpecPublic, ResourceSpecsPublic
from optimizer_service.core.documents import get_resources_row, list_rows
from stratagem.ir import ResourceSpec

router = APIRouter(prefix="/v1/resources", tags=["resources"], dependencies=[Depends(require_read_key)])


def resources_public(row: ResourceSpecRow, request: Request) -> ResourceSpecPublic:
    url = str(request.url_for("get_resources", resource_id=row.id))
    return ResourceSpecPublic(
        id=row.id, name=row.name, created_at=row.created_at, url=url, **resources_summary(row.json)
    )


@router.post(
    "",
    status_code=201,
    openapi_extra=json_body(ResourceSpec),
    responses={
        200: {"model": ResourceSpecPublic, "description": "Already stored: the same document was uploaded before"}
    },
)
async def upload_resources(
    request: Request, response: Response, state: StateDep, _: WriteAuthDep
) -> ResourceSpecPublic:
    """The body (a `ResourceSpec`) is parsed, validated and stored off the event loop."""
    stored = await uploaded(state, "resources", request, response)
    url = str(request.url_for("get_resources", resource_id=stored["id"]))
    return ResourceSpecPublic(url=url, **stored)


@router.get("")
def list_resources(session: SessionDep, request: Request, limit: Limit = 50, offset: Offset = 0) -> ResourceSpecsPublic:
    rows, count = list_rows(session, ResourceSpecRow, limit=limit, offset=offset)
    return ResourceSpecsPublic(data=[resources_public(row, request) for row in rows], count=count)


@router.get("/{resource_id}", response_model=ResourceSpec, responses={404: {"model": ErrorPublic}})
def get_resources(resource_id: str, session: SessionDep) -> JSONResponse:
    return JSONResponse(get_resources_row(session, checked_id("resource spec", resource_id)).json)
