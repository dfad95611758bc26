"""Constructors for the domain errors the core raises; `api/errors.py` maps them to HTTP statuses.

They are the client SDK's own error classes (`stratagem.errors.ServiceError` and subclasses) with the
intended status attached, so a client and the service speak of the same failures by the same names.
"""

from __future__ import annotations

import json
from typing import Any

from optimizer_service.core.inputs import UNION_TAGS
from stratagem.errors import InvalidDocumentError, NotFoundError, RequestRejectedError, ServiceUnavailableError


def _located(loc: list[str | int] | None, message: str) -> object:
    return [{"loc": loc, "msg": message}] if loc else message


def not_found(what: str, ident: object, *, loc: list[str | int] | None = None) -> NotFoundError:
    message = f"no {what} with id {str(ident)!r}"
    return NotFoundError(message, status=404, detail=_located(loc, message))


def rejected(message: str, *, status: int = 422, loc: list[str | int] | None = None) -> RequestRejectedError:
    return RequestRejectedError(message, status=status, detail=_located(loc, message))


def conflict(message: str) -> RequestRejectedError:
    return RequestRejectedError(message, status=409, detail=message)


def queue_full(queued: int, limit: int, retry_after_s: int) -> ServiceUnavailableError:
    message = f"the job queue is full ({queued} queued, limit {limit}); retry in {retry_after_s} s"
    return ServiceUnavailableError(message, status=429, detail={"message": message, "retry_after_s": retry_after_s})


def unavailable(message: str) -> ServiceUnavailableError:
    return ServiceUnavailableError(message, status=503, detail=message)


def document_rejected(error: InvalidDocumentError, prefix: list[str | int]) -> RequestRejectedError:
    """A document's problems as a 422 whose locations point into the request (e.g. `body.resources`)."""
    detail = [{"loc": [*prefix, *path_parts(p.path)], "msg": p.reason} for p in error.problems]
    return RequestRejectedError(str(error), status=422, detail=detail)


def path_parts(path: str) -> list[str | int]:
    """`layers[2].inputs[0]` -> ['layers', 2, 'inputs', 0]: a Problem path as a FastAPI-style loc."""
    parts: list[str | int] = []
    for segment in path.replace("]", "").replace("[", ".").split("."):
        if segment:
            parts.append(int(segment) if segment.isdigit() else segment)
    return parts


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
