"""A Stratagem service in a process of its own, for the load benchmark and the tests that need a real
server: its command line, an environment the caller's shell cannot configure, and the wait for `/healthz`.

The developer's own `STRATAGEM_*` settings, `DATABASE_URL` or `RAY_ADDRESS` would otherwise decide
where the server stores its jobs and runs its trials, and a run would measure or test that instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]


def service_environment(**variables: str) -> dict[str, str]:
    """This process's environment without the variables that configure a service, plus `variables`."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("STRATAGEM_") and key not in ("DATABASE_URL", "RAY_ADDRESS")
    }
    return {**environment, **variables}


def start_serve(
    port: int, database_url: str, *options: str, env: dict[str, str] | None = None, **popen: Any
) -> subprocess.Popen[Any]:
    """`stratagem serve --port PORT --database-url URL OPTIONS...` from the repository root."""
    command = [sys.executable, "-m", "stratagem", "serve", "--port", str(port), "--database-url", database_url]
    return subprocess.Popen([*command, *options], cwd=ROOT, env=service_environment() if env is None else env, **popen)


def wait_healthy(
    url: str, process: subprocess.Popen[Any], *, timeout_s: float = 60.0, log: Callable[[], str] | None = None
) -> dict[str, Any]:
    """The first 200 answer of `url`/healthz, once the server gives one.

    RuntimeError if the process exits first or `timeout_s` passes; the message carries `log()`, or
    when none is given what an exited process wrote to its stdout pipe.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}: {log() if log else _drained(process)}")
        try:
            response = httpx.get(f"{url}/healthz", timeout=2)
            if response.status_code == 200:
                return dict(response.json())
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server was not healthy within {timeout_s:.0f} s: {log() if log else ''}")


def _drained(process: subprocess.Popen[Any]) -> str:
    output = process.stdout.read() if process.stdout else ""
    return output.decode(errors="replace") if isinstance(output, bytes) else str(output)
