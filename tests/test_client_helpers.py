"""Helpers for tests that drive a real service over HTTP: the app under uvicorn in a thread.

The SDK is synchronous and httpx's ASGI transport is async-only, so the tests serve the app for
real on a free port: every request goes through uvicorn, the middleware and the database. This
module holds no tests.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

from test_service_helpers import service_settings

from examples.demo import ServiceThread
from optimizer_service.app import create_app


@contextlib.contextmanager
def served(database_url: str, **settings: Any) -> Iterator[str]:
    """A started service on `database_url` (fast settings, one worker, no trials); yields its URL."""
    with ServiceThread(create_app(service_settings(database_url, **settings))) as service:
        yield service.url


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def closed_port_url() -> str:
    """A URL nothing listens on: the port was free a moment ago and is closed again."""
    return f"http://127.0.0.1:{free_port()}"
