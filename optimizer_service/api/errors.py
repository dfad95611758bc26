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

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from optimizer_service.core.errors import path_parts
from optimizer_service.core.inputs import UNION_TAGS
from stratagem.errors import InfeasibleStrategyError, InvalidDocumentError, ServiceError, UnsupportedStrategyError

log = logging.getLogger(__name__)

DEFAULT_STATUS = {"NotFoundError": 404, "RequestRejectedError": 422, "ServiceUnavailableError": 503}


def request_id_of(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def error_response(request: Request, status: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"detail": detail, "request_id": request_id_of(request)}
    return JSONResponse(status_code=status, content=body, headers=headers)


def validation_problems(errors: list[dict[str, Any]], body: Any = None) -> list[dict[str, Any]]:
    """pydantic's errors as `{loc, msg}`, with union tags dropped and document problems expanded."""
    problems = []
    for item in errors:
        loc = [part for part in item.get("loc", ()) if part not in UNION_TAGS]
        cause = (item.get("ctx") or {}).get("error")
        if isinstance(cause, InvalidDocumentError):
            problems += [{"loc": [*loc, *path_parts(p.path)], "msg": p.reason} for p in cause.problems]
            continue
        message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
        if item.get("type") == "json_invalid":
            loc, message = ["body"], _json_problem(item, loc, body)
        elif loc == ["body"]:
            message = _whole_body_problem(item, message)
        problems.append({"loc": loc, "msg": message})
    return problems


def _json_problem(item: dict[str, Any], loc: list[Any], body: Any) -> str:
    """FastAPI puts the parser's character offset in `loc`, where clients expect a field path, and keeps
    only the parser's message, which ends in a dangling "at" ("Unterminated string starting at"); the
    offset goes into the words instead, as line and column when the body is at hand."""
    reason = str((item.get("ctx") or {}).get("error", "JSON decode error"))
    position = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    if position is None:
        return f"the body is not valid JSON: {reason}"
    if isinstance(body, str):
        where = str(json.JSONDecodeError("", body, position)).removeprefix(": ")
    else:
        where = f"char {position}"
    return f"the body is not valid JSON: {reason.removesuffix(' at')} at {where}"


def _whole_body_problem(item: dict[str, Any], message: str) -> str:
    """pydantic's words for these two ("Field required", "Input should be a valid dictionary") describe
    the model, not what the client did: sent nothing, or sent JSON under another content type, which
    FastAPI then hands over as raw bytes."""
    if item.get("type") == "missing":
        return "the body is empty; expected a JSON object"
    if isinstance(item.get("input"), bytes | bytearray):
        return "the body was not read as JSON: send it with 'Content-Type: application/json'"
    return message


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


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(ServiceError, _on_service_error)
    app.add_exception_handler(InvalidDocumentError, _on_document_error)
    app.add_exception_handler(UnsupportedStrategyError, _on_unexpressible)
    app.add_exception_handler(InfeasibleStrategyError, _on_unexpressible)
    app.add_exception_handler(StarletteHTTPException, _on_http)
