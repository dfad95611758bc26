"""Request bodies that carry documents: read as bytes, handed to the core's `Ingestor` off the event loop.

FastAPI would parse and validate a declared body on the event loop, where a large document stalls
every other request (`optimizer_service.core.ingest` says why a thread is not enough). So these
routes declare no body parameter: they read the bytes and let the ingestor parse, validate and act.
The OpenAPI document still shows each body's full schema: `json_body(Model)` names it in the
operation, and `openapi_with_bodies` adds the models to the components.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from optimizer_service.core.errors import unavailable
from optimizer_service.core.ingest import Kind
from optimizer_service.state import ServiceState

REF = "#/components/schemas/{model}"


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for an operation whose JSON body is `model`."""
    schema = {"$ref": REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


async def ingested(state: ServiceState, kind: Kind, request: Request) -> dict[str, Any]:
    """The core's summary of what the body made happen; its errors are raised as the core's."""
    if state.factory is None or state.ingest is None:
        raise unavailable("the database is not ready")
    body = await request.body()
    return await state.ingest.run(kind, body, request.headers.get("content-type"), state.factory)


async def uploaded(state: ServiceState, kind: Kind, request: Request, response: Response) -> dict[str, Any]:
    """`ingested` for an upload of a content-addressed document: 201 when it is new, 200 when the same
    document was stored before (so a client may upload unconditionally)."""
    stored = await ingested(state, kind, request)
    response.status_code = 201 if stored.pop("created") else 200
    return stored


def openapi_with_bodies(app: FastAPI, bodies: list[type[BaseModel]]) -> dict[str, Any]:
    """The app's OpenAPI document, with the request-body models (and everything they use) as components."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        separate_input_output_schemas=False,
    )
    _, definitions = models_json_schema([(model, "validation") for model in bodies], ref_template=REF)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in definitions.get("$defs", {}).items():
        components.setdefault(name, definition)
    app.openapi_schema = schema
    return schema
