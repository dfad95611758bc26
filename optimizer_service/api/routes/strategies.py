"""`/v1/strategies/{id}`: a stored strategy as JSON, as AutoDist's strategy text, or as the config of a
trainer (torchtitan TOML, DeepSpeed JSON, Megatron-LM arguments, Accelerate YAML)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from sqlalchemy.orm import Session

from models import GraphRow
from optimizer_service.api.deps import SessionDep, require_read_key
from optimizer_service.api.routes.documents_common import checked_id
from optimizer_service.api.schemas import ErrorPublic
from optimizer_service.core.documents import get_strategy_row, load_strategy
from optimizer_service.core.errors import unavailable
from stratagem.errors import StratagemError
from stratagem.interop.engines import ENGINES, FILES, render
from stratagem.ir import ModelGraph, Strategy

router = APIRouter(prefix="/v1/strategies", tags=["strategies"], dependencies=[Depends(require_read_key)])

Format = Literal["json", "autodist", "torchtitan", "deepspeed", "megatron", "accelerate"]


@router.get(
    "/{strategy_id}",
    response_model=Strategy,
    responses={
        200: {
            "content": {"text/plain": {}, "application/toml": {}, "application/yaml": {}},
            "description": "The Strategy JSON, AutoDist's text, or a trainer's config (format=...)",
        },
        404: {"model": ErrorPublic},
        422: {"model": ErrorPublic, "description": "The format cannot express this strategy (the reason says why)"},
    },
)
def get_strategy(
    strategy_id: str,
    session: SessionDep,
    format: Annotated[
        Format,
        Query(
            description="`autodist`: AutoDist's strategy protobuf text; `torchtitan`, `deepspeed`, `megatron`, "
            "`accelerate`: that trainer's config for the strategy's layout (batch sizes from its graph)"
        ),
    ] = "json",
) -> Response:
    row = get_strategy_row(session, checked_id("strategy", strategy_id))
    if format == "json":
        return JSONResponse(row.json)
    strategy = load_strategy(row)
    if format in ENGINES:
        graph = _stored_graph(session, row.graph_id)
        text = render(format, getattr(strategy, f"to_{format}")(graph))
        media, suffix = FILES[format]
        disposition = f'attachment; filename="strategy-{row.id[:12]}-{format}.{suffix}"'
        return Response(text, media_type=media, headers={"Content-Disposition": disposition})
    try:
        text = strategy.to_autodist()
    except ImportError as error:
        raise unavailable(f"AutoDist export is not installed in this service ({error})") from None
    return PlainTextResponse(text)


def _stored_graph(session: Session, graph_id: str | None) -> ModelGraph | None:
    """The strategy's graph (its batch is the micro-batch), where the service holds it."""
    row = session.get(GraphRow, graph_id) if graph_id else None
    if row is None:
        return None
    try:
        return ModelGraph.parse(row.json)
    except StratagemError:
        return None
