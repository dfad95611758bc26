"""Pure-ASGI middleware: request ids, metrics and the catch-all 500; and the body-size limit.

Written against raw ASGI rather than `BaseHTTPMiddleware` so streaming bodies are counted as they
arrive and no response is buffered.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from optimizer_service.api.errors import internal_error_body
from optimizer_service.metrics import ServiceMetrics

log = logging.getLogger(__name__)


async def _send_json(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    payload = json.dumps(body).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": payload})


class RequestContextMiddleware:
    """Gives each request an id (echoed as `X-Request-ID`), records metrics, and turns crashes into JSON 500s."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _incoming_id(scope) or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        status = {"code": 500, "started": False}
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception(
                "unhandled error in %s %s (request id %s)", scope.get("method"), scope.get("path"), request_id
            )
            if not status["started"]:
                status["code"] = 500
                await _send_json(send, 500, internal_error_body(request_id), [(b"x-request-id", request_id.encode())])
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe(scope.get("method", "?"), route, int(status["code"]), time.perf_counter() - started)


def _incoming_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            text = value.decode("latin-1")[:64]
            return text if text.replace("-", "").isalnum() else None
    return None


class BodyLimitMiddleware:
    """413 for bodies over `max_bytes`, by the declared Content-Length or by what actually arrives.

    The body is read (up to the limit) before the app runs, so an oversized chunked upload is refused
    before any handler has touched the database.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, send, f"declared Content-Length {declared}")
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, send, f"more than {self.max_bytes} bytes received")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send, what: str) -> None:
        request_id = scope.get("state", {}).get("request_id")
        detail = f"request body too large: {what}; the limit is {self.max_bytes} bytes"
        await _send_json(send, 413, {"detail": detail, "request_id": request_id}, [(b"connection", b"close")])


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
