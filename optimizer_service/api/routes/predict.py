"""`POST /v1/predict`: price up to 64 layouts or strategies on a cluster, synchronously, without a job.

The graph and the cluster come inline or by id (as `/v1/optimize` takes them); layouts come as
documents or in their short form (`"dp=8,tp=4,pp=2,mb=1,gbs=512"`). Nothing is stored. Problems answer
422 with the location of the layout or strategy at fault (`body.layouts.2.tensor`).
"""

from __future__ import annotations

from typing import Annotated, Any, Self

from fastapi import APIRouter, Depends
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from optimizer_service.api.deps import SessionDep, require_read_key
from optimizer_service.api.schemas import ErrorPublic
from optimizer_service.core.documents import get_graph_row, get_resources_row, load_graph, load_resources
from optimizer_service.core.errors import document_rejected, path_parts, rejected
from optimizer_service.core.inputs import ContentId, ResourcesInput
from optimizer_service.core.jobs import autodist_resources
from stratagem.errors import InvalidDocumentError, UnsupportedStrategyError
from stratagem.ir import ModelGraph, ResourceSpec, Strategy
from stratagem.layout import Layout
from stratagem.prediction import Prediction, predict

router = APIRouter(prefix="/v1/predict", tags=["predict"], dependencies=[Depends(require_read_key)])

MAX_ITEMS = 64


def _layout_text(value: Any) -> Any:
    return Layout.from_string(value) if isinstance(value, str) else value


LayoutInput = Annotated[Layout, BeforeValidator(_layout_text)]


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    graph: ModelGraph | None = None
    graph_id: ContentId | None = None
    resources: ResourcesInput | None = None
    """A ResourceSpec, or the text of an AutoDist resource_spec.yml."""
    resource_id: ContentId | None = None
    device: str = Field(default="T4", min_length=1, max_length=64)
    """GPU kind of the nodes of an AutoDist resource spec, which does not say."""
    layouts: list[LayoutInput] = Field(default_factory=list, max_length=MAX_ITEMS)
    """Layout documents, or their short form `"dp=8,tp=4,pp=2,mb=1,gbs=512,precision=amp-bf16"`."""
    strategies: list[Strategy] = Field(default_factory=list, max_length=MAX_ITEMS)

    @model_validator(mode="after")
    def _check(self) -> Self:
        for document, reference in (("graph", "graph_id"), ("resources", "resource_id")):
            given = [name for name in (document, reference) if getattr(self, name) is not None]
            if len(given) != 1:
                how = "both were given" if given else "neither was given"
                raise ValueError(f"{document}: give exactly one of '{document}' and '{reference}'; {how}")
        count = len(self.layouts) + len(self.strategies)
        if not 1 <= count <= MAX_ITEMS:
            raise ValueError(f"layouts: give 1 to {MAX_ITEMS} layouts and strategies in all, got {count}")
        return self


class PredictionsPublic(BaseModel):
    data: list[Prediction]
    """Layouts first, in the order given, then strategies."""
    count: int
    graph_id: str
    resource_id: str


@router.post(
    "",
    response_model=PredictionsPublic,
    responses={404: {"model": ErrorPublic}, 422: {"model": ErrorPublic}},
)
def post_predict(body: PredictRequest, session: SessionDep) -> PredictionsPublic:
    graph = body.graph or load_graph(get_graph_row(session, str(body.graph_id), loc=["body", "graph_id"]))
    resources = _resources(session, body)
    items: list[Layout | Strategy] = [*body.layouts, *body.strategies]
    try:
        predictions = predict(graph, resources, items)
    except InvalidDocumentError as error:
        raise _located_document(error, len(body.layouts)) from None
    except UnsupportedStrategyError as error:
        index, message = _index(str(error))
        raise rejected(message, loc=_where(index, len(body.layouts))) from None
    return PredictionsPublic(
        data=predictions, count=len(predictions), graph_id=str(graph.id), resource_id=str(resources.id)
    )


def _resources(session: SessionDep, body: PredictRequest) -> ResourceSpec:
    if body.resource_id is not None:
        return load_resources(get_resources_row(session, body.resource_id, loc=["body", "resource_id"]))
    if isinstance(body.resources, str):
        return autodist_resources(body.resources, device=body.device)
    return body.resources  # type: ignore[return-value]


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


def _located_document(error: InvalidDocumentError, layouts: int) -> Exception:
    detail = []
    for problem in error.problems:
        parts = path_parts(problem.path)
        index = parts[0] if parts and isinstance(parts[0], int) else None
        rest = parts[1:] if index is not None else parts
        detail.append({"loc": [*_where(index, layouts), *rest], "msg": problem.reason})
    located = document_rejected(error, ["body"])
    located.detail = detail
    return located
