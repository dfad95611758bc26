"""Constructors for the domain errors the core raises; `api/errors.py` maps them to HTTP statuses.

They are the client SDK's own error classes (`stratagem.errors.ServiceError` and subclasses) with the
intended status attached, so a client and the service speak of the same failures by the same names.
"""

from __future__ import annotations

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
