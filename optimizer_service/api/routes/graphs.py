"""`/v1/graphs`: upload (deduplicated by content id), list and fetch ModelGraph documents."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from models import GraphRow
from optimizer_service.api.bodies import ingested, json_body
from optimizer_service.api.deps import SessionDep, StateDep, WriteAuthDep, require_read_key
from optimizer_service.api.routes.documents_common import Limit, Offset, checked_id, graph_summary
from optimizer_service.api.schemas import ErrorPublic, GraphPublic, GraphsPublic
from optimizer_service.core.documents import get_graph_row, list_rows
from stratagem.ir import ModelGraph

router = APIRouter(prefix="/v1/graphs", tags=["graphs"], dependencies=[Depends(require_read_key)])


def graph_public(row: GraphRow, request: Request) -> GraphPublic:
    url = str(request.url_for("get_graph", graph_id=row.id))
    return GraphPublic(id=row.id, name=row.name, created_at=row.created_at, url=url, **graph_summary(row.json))


@router.post(
    "",
    status_code=201,
    openapi_extra=json_body(ModelGraph),
    responses={200: {"model": GraphPublic, "description": "Already stored: the same document was uploaded before"}},
)
async def upload_graph(request: Request, response: Response, state: StateDep, _: WriteAuthDep) -> GraphPublic:
    """The body (a `ModelGraph`) is parsed, validated and stored off the event loop."""
    stored = await ingested(state, "graph", request)
    response.status_code = 201 if stored.pop("created") else 200
    return GraphPublic(url=str(request.url_for("get_graph", graph_id=stored["id"])), **stored)


@router.get("")
def list_graphs(session: SessionDep, request: Request, limit: Limit = 50, offset: Offset = 0) -> GraphsPublic:
    rows, count = list_rows(session, GraphRow, limit=limit, offset=offset)
    return GraphsPublic(data=[graph_public(row, request) for row in rows], count=count)


@router.get("/{graph_id}", response_model=ModelGraph, responses={404: {"model": ErrorPublic}})
def get_graph(graph_id: str, session: SessionDep) -> JSONResponse:
    return JSONResponse(get_graph_row(session, checked_id("graph", graph_id)).json)
