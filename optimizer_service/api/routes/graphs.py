"""`/v1/graphs`: upload (deduplicated by content id), list and fetch ModelGraph documents, and the
operator traces stored beside them.

A graph is uploaded alone (the body is the ModelGraph) or with its operator trace:
`{"graph": <ModelGraph>, "trace": "<base64 of the gzip-compressed trace JSON>"}`. A graph may name a
trace (`trace_id`) that is not uploaded: its trials then replay the per-layer totals.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request, Response
from fastapi.responses import JSONResponse

from models import GraphRow
from optimizer_service.api.deps import SessionDep, WriteAuthDep, require_read_key
from optimizer_service.api.routes.documents_common import Limit, Offset, checked_id, graph_summary
from optimizer_service.api.schemas import ErrorPublic, GraphPublic, GraphsPublic
from optimizer_service.core.documents import get_graph_row, get_trace_row, list_rows, store_graph, store_trace
from optimizer_service.core.errors import document_rejected, not_found, rejected
from stratagem.errors import InvalidDocumentError
from stratagem.ir import ModelGraph
from stratagem.tracing.optrace import OperatorTrace, trace_graph_problems

router = APIRouter(prefix="/v1/graphs", tags=["graphs"], dependencies=[Depends(require_read_key)])

MAX_TRACE_BYTES = 12 << 20
"""Compressed size of an uploaded trace: a 7B decoder's is well under 1 MiB (`benchmarks/trials.py`)."""
MAX_TRACE_JSON_BYTES = 256 << 20
"""What a trace may inflate to; a larger one is refused before it is parsed."""
_MAX_TRACE_TEXT = (MAX_TRACE_BYTES + 2) // 3 * 4

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
                                    "maxLength": _MAX_TRACE_TEXT,
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
def upload_graph(
    body: Annotated[Any, Body()], session: SessionDep, request: Request, response: Response, _: WriteAuthDep
) -> GraphPublic:
    graph, trace = parse_upload(body)
    row, created = store_graph(session, graph)
    if trace is not None:
        store_trace(session, trace, trace.to_bytes())
    session.commit()
    response.status_code = 201 if created else 200
    return graph_public(row, request)


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


def parse_upload(body: Any) -> tuple[ModelGraph, OperatorTrace | None]:
    """The graph and, when one came with it, its trace; every refusal names the field and the reason."""
    if not isinstance(body, dict):
        raise rejected(
            f"the body must be a JSON object (a ModelGraph, or {{graph, trace}}), got {type(body).__name__}",
            loc=["body"],
        )
    if "graph" not in body or "layers" in body:
        return _graph(body, ["body"]), None
    unknown = sorted(set(body) - {"graph", "trace"})
    if unknown:
        raise rejected(
            f"unknown field {unknown[0]!r}; a graph upload has 'graph' and 'trace'", loc=["body", unknown[0]]
        )
    graph = _graph(body["graph"], ["body", "graph"])
    if body.get("trace") is None:
        return graph, None
    trace = _trace(body["trace"])
    problems = trace_graph_problems(trace, graph)
    if problems:
        raise document_rejected(InvalidDocumentError(problems, document="graph upload"), ["body"])
    return graph, trace


def _graph(data: Any, loc: list[str | int]) -> ModelGraph:
    if not isinstance(data, dict):
        raise rejected(f"a ModelGraph is a JSON object, got {type(data).__name__}", loc=loc)
    try:
        return ModelGraph.parse(data)
    except InvalidDocumentError as error:
        raise document_rejected(error, loc) from None


def _trace(text: Any) -> OperatorTrace:
    loc: list[str | int] = ["body", "trace"]
    if not isinstance(text, str):
        raise rejected("must be base64 text of the gzip-compressed trace JSON", loc=loc)
    if len(text) > _MAX_TRACE_TEXT:
        raise rejected(f"the trace is {len(text) * 3 // 4} bytes compressed; the limit is {MAX_TRACE_BYTES}", loc=loc)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:
        raise rejected(f"not base64 ({error})", loc=loc) from None
    try:
        return OperatorTrace.from_bytes(data, max_json_bytes=MAX_TRACE_JSON_BYTES)
    except InvalidDocumentError as error:
        raise document_rejected(error, loc) from None
