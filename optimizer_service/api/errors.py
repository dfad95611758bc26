"""The one place where errors become HTTP responses.

- Request validation (including the IR documents' own validators) -> 422, `detail` a list of
  `{loc, msg}` with the field path and a reason in words.
- The core's domain errors (`stratagem.errors.ServiceError` subclasses) -> the status they carry;
  a full queue adds `Retry-After`.
- Invalid documents found by the core -> 422 with each problem's path; a strategy a consumer cannot
  express (`UnsupportedStrategyError`) -> 422 with the reason.
- Anything else -> a JSON 500 with the request id; the stack trace goes to the log, never the client.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from optimizer_service.core.errors import path_parts, validation_problems
from optimizer_service.core.ingest import BodyRejected
from stratagem.errors import InfeasibleStrategyError, InvalidDocumentError, ServiceError, UnsupportedStrategyError

log = logging.getLogger(__name__)

DEFAULT_STATUS = {"NotFoundError": 404, "RequestRejectedError": 422, "ServiceUnavailableError": 503}


def request_id_of(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def error_response(request: Request, status: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"detail": detail, "request_id": request_id_of(request)}
    return JSONResponse(status_code=status, content=body, headers=headers)


async def _on_validation(request: Request, error: Exception) -> JSONResponse:
    if not isinstance(error, RequestValidationError):
        raise error
    return error_response(request, 422, validation_problems(list(error.errors()), error.body))


async def _on_service_error(request: Request, error: Exception) -> JSONResponse:
    if not isinstance(error, ServiceError):
        raise error
    status = error.status or DEFAULT_STATUS.get(type(error).__name__, 500)
    detail = error.detail if error.detail is not None else str(error)
    headers = None
    if isinstance(detail, dict) and "retry_after_s" in detail:
        headers = {"Retry-After": str(detail["retry_after_s"])}
        detail = detail.get("message", str(error))
    return error_response(request, status, detail, headers)


async def _on_document_error(request: Request, error: Exception) -> JSONResponse:
    if not isinstance(error, InvalidDocumentError):
        raise error
    return error_response(request, 422, [{"loc": path_parts(p.path), "msg": p.reason} for p in error.problems])


async def _on_unexpressible(request: Request, error: Exception) -> JSONResponse:
    return error_response(request, 422, str(error))


async def _on_http(request: Request, error: Exception) -> JSONResponse:
    if not isinstance(error, StarletteHTTPException):
        raise error
    return error_response(request, error.status_code, error.detail, dict(error.headers or {}) or None)


def internal_error_body(request_id: str | None) -> dict[str, Any]:
    return {
        "detail": "internal server error; the service logged the details under this request id",
        "request_id": request_id,
    }


async def _on_body_rejected(request: Request, error: Exception) -> JSONResponse:
    if not isinstance(error, BodyRejected):
        raise error
    return error_response(request, 422, error.problems)


def install(app: FastAPI) -> None:
    app.add_exception_handler(BodyRejected, _on_body_rejected)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(ServiceError, _on_service_error)
    app.add_exception_handler(InvalidDocumentError, _on_document_error)
    app.add_exception_handler(UnsupportedStrategyError, _on_unexpressible)
    app.add_exception_handler(InfeasibleStrategyError, _on_unexpressible)
    app.add_exception_handler(StarletteHTTPException, _on_http)
