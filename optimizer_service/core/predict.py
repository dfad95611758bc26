"""Pricing layouts and strategies without a job: the rules behind `POST /v1/predict`.

The graph and the cluster come inline or by id (as `/v1/optimize` takes them); nothing is stored.
Problems are 422s at the layout or strategy at fault (`body.layouts.2.tensor`). The request body is
parsed, validated and priced by the ingestor (`core/ingest.py`), off the event loop, in the parser
process when it is large, like every body that carries a document.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from optimizer_service.core.errors import document_rejected, path_parts, rejected
from optimizer_service.core.inputs import PredictInput
from optimizer_service.core.jobs import graph_document, resources_document
from stratagem.errors import InvalidDocumentError, RequestRejectedError, UnsupportedStrategyError
from stratagem.ir import Strategy
from stratagem.layout import Layout
from stratagem.prediction import predict


def predictions(session: Session, request: PredictInput) -> dict[str, Any]:
    """`{data, count, graph_id, resource_id}`: every layout, then every strategy, priced in one call."""
    graph, resources = graph_document(session, request), resources_document(session, request)
    items: list[Layout | Strategy] = [*request.layouts, *request.strategies]
    try:
        priced = predict(graph, resources, items)
    except InvalidDocumentError as error:
        raise _located_document(error, len(request.layouts)) from None
    except UnsupportedStrategyError as error:
        index, message = _index(str(error))
        raise rejected(message, loc=_where(index, len(request.layouts))) from None
    return {
        "data": [p.model_dump(mode="json") for p in priced],
        "count": len(priced),
        "graph_id": str(graph.id),
        "resource_id": str(resources.id),
    }


def _where(index: int | None, layouts: int) -> list[str | int]:
    if index is None:
        return ["body"]
    return ["body", "layouts", index] if index < layouts else ["body", "strategies", index - layouts]


def _index(message: str) -> tuple[int | None, str]:
    """`predict` names a list item as `[i]`; the request names it by its own list."""
    head, sep, rest = message.partition("]: ")
    if sep and head.startswith("[") and head[1:].isdigit():
        return int(head[1:]), rest
    return None, message


def _located_document(error: InvalidDocumentError, layouts: int) -> RequestRejectedError:
    detail = []
    for problem in error.problems:
        parts = path_parts(problem.path)
        index = parts[0] if parts and isinstance(parts[0], int) else None
        rest = parts[1:] if index is not None else parts
        detail.append({"loc": [*_where(index, layouts), *rest], "msg": problem.reason})
    located = document_rejected(error, ["body"])
    located.detail = detail
    return located
