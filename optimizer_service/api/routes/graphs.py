"""`/v1/graphs`: upload (deduplicated by content id), list and fetch ModelGraph documents, and the
operator traces stored beside them.

A graph is uploaded alone (the body is the ModelGraph) or with its operator trace:
`{"graph": <ModelGraph>, "trace": "<base64 of the gzip-compressed trace JSON>"}`. A graph may name a
trace (`trace_id`) that is not uploaded: its trials then replay the per-layer totals.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from models import GraphRow
from optimizer_service.api.bodies import uploaded
from optimizer_service.api.deps import SessionDep, StateDep, WriteAuthDep, require_read_key
from optimizer_service.api.routes.documents_common import Limit, Offset, checked_id, graph_summary
from optimizer_service.api.schemas import ErrorPublic, GraphPublic, GraphsPublic
from optimizer_service.core.documents import get_graph_row, get_trace_row, list_rows
from optimizer_service.core.errors import not_found
from optimizer_service.core.graph_upload import MAX_TRACE_TEXT
from stratagem.ir import ModelGraph

router = APIRouter(prefix="/v1/graphs", tags=["graphs"], dependencies=[Depends(require_read_key)])

_UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        {"$ref": "#/components/schemas/ModelGraph"},
                        {
                            "type": "object",
                            "title": "GraphWithTrace",
                            "required": ["graph"],
                            "additionalProperties": False,
                            "properties": {
                                "graph": {"$ref": "#/components/schemas/ModelGraph"},
                                "trace": {
                                    "type": "string",
                                    "maxLength": MAX_TRACE_TEXT,
                                    "description": "The graph's operator trace: base64 of its gzip-compressed JSON "
                                    "(stratagem.tracing.OperatorTrace.to_bytes); its id must be the graph's trace_id",
                                },
                            },
                        },
                    ]
                }
            }
        },
    }
}


def graph_public(row: GraphRow, request: Request) -> GraphPublic:
    url = str(request.url_for("get_graph", graph_id=row.id))
    return GraphPublic(id=row.id, name=row.name, created_at=row.created_at, url=url, **graph_summary(row.json))


@router.post(
    "",
    status_code=201,
    openapi_extra=_UPLOAD_BODY,
    responses={200: {"model": GraphPublic, "description": "Already stored: the same document was uploaded before"}},
)
async def upload_graph(request: Request, response: Response, state: StateDep, _: WriteAuthDep) -> GraphPublic:
    """The body (a `ModelGraph`, or `{graph, trace}`) is parsed, validated and stored off the event loop."""
    stored = await uploaded(state, "graph", request, response)
    return GraphPublic(url=str(request.url_for("get_graph", graph_id=stored["id"])), **stored)


@router.get("")
def list_graphs(session: SessionDep, request: Request, limit: Limit = 50, offset: Offset = 0) -> GraphsPublic:
    rows, count = list_rows(session, GraphRow, limit=limit, offset=offset)
    return GraphsPublic(data=[graph_public(row, request) for row in rows], count=count)


@router.get("/{graph_id}", response_model=ModelGraph, responses={404: {"model": ErrorPublic}})
def get_graph(graph_id: str, session: SessionDep) -> JSONResponse:
    return JSONResponse(get_graph_row(session, checked_id("graph", graph_id)).json)


@router.get(
    "/{graph_id}/trace",
    response_class=Response,
    responses={
        200: {"content": {"application/gzip": {}}, "description": "The gzip-compressed JSON of the operator trace"},
        404: {"model": ErrorPublic},
    },
)
def get_graph_trace(graph_id: str, session: SessionDep) -> Response:
    graph = get_graph_row(session, checked_id("graph", graph_id))
    trace_id = graph.json.get("trace_id")
    if not isinstance(trace_id, str):
        raise not_found("operator trace for graph", graph_id)
    return Response(get_trace_row(session, trace_id).data, media_type="application/gzip")
