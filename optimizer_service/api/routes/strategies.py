"""`/v1/strategies/{id}`: a stored strategy as JSON, or as AutoDist's strategy text."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from optimizer_service.api.deps import SessionDep, require_read_key
from optimizer_service.api.routes.documents_common import checked_id
from optimizer_service.api.schemas import ErrorPublic
from optimizer_service.core.documents import get_strategy_row, load_strategy
from optimizer_service.core.errors import unavailable
from stratagem.ir import Strategy

router = APIRouter(prefix="/v1/strategies", tags=["strategies"], dependencies=[Depends(require_read_key)])


@router.get(
    "/{strategy_id}",
    response_model=Strategy,
    responses={
        200: {
            "content": {"text/plain": {}},
            "description": "The Strategy JSON, or AutoDist's text with format=autodist",
        },
        404: {"model": ErrorPublic},
        422: {"model": ErrorPublic, "description": "AutoDist cannot express this strategy (the reason says why)"},
    },
)
def get_strategy(
    strategy_id: str,
    session: SessionDep,
    format: Annotated[
        Literal["json", "autodist"], Query(description="`autodist`: AutoDist's strategy protobuf text")
    ] = "json",
) -> Response:
    row = get_strategy_row(session, checked_id("strategy", strategy_id))
    if format == "json":
        return JSONResponse(row.json)
    strategy = load_strategy(row)
    try:
        text = strategy.to_autodist()
    except ImportError as error:
        raise unavailable(f"AutoDist export is not installed in this service ({error})") from None
    return PlainTextResponse(text)
