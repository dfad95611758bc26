"""`POST /v1/predict`: price up to 64 layouts or strategies on a cluster, synchronously, without a job.

The graph and the cluster come inline or by id (as `/v1/optimize` takes them); layouts come as
documents or in their short form (`"dp=8,tp=4,pp=2,mb=1,gbs=512"`). Nothing is stored. Problems answer
422 with the location of the layout or strategy at fault (`body.layouts.2.tensor`). The body is parsed,
validated and priced off the event loop (a large inline graph in the parser process), as every body
that carries a document is (`api/bodies.py`); the rules are the core's (`core/predict.py`).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from optimizer_service.api.bodies import ingested, json_body
from optimizer_service.api.deps import StateDep, require_read_key
from optimizer_service.api.schemas import ErrorPublic, PredictRequest
from stratagem.prediction import Prediction

router = APIRouter(prefix="/v1/predict", tags=["predict"], dependencies=[Depends(require_read_key)])


class PredictionsPublic(BaseModel):
    data: list[Prediction]
    """Layouts first, in the order given, then strategies."""
    count: int
    graph_id: str
    resource_id: str


@router.post(
    "",
    response_model=PredictionsPublic,
    openapi_extra=json_body(PredictRequest),
    responses={404: {"model": ErrorPublic}, 422: {"model": ErrorPublic}},
)
async def post_predict(request: Request, state: StateDep) -> JSONResponse:
    """The body is a `PredictRequest`."""
    return JSONResponse(await ingested(state, "predict", request))
