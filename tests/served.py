"""A real service process for tests that need one: `python -m optimizer_service` under uvicorn.

Used where only a real process shows the behaviour: `kill -9` mid-trial, many clients at once, an
event loop that must stay responsive. The environment is the test's, minus any Stratagem settings
the developer's shell may carry, plus what the test passes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Served:
    """One service process on a free port; `kill()` is `kill -9`, `stop()` a graceful SIGTERM."""

    def __init__(self, database_url: str, log_path: Path, **settings: object) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAGEM_") and k != "RAY_ADDRESS"}
        env["DATABASE_URL"] = database_url
        # lower-case keys are service settings; upper-case ones plain environment variables (TMPDIR)
        env.update({k if k.isupper() else f"STRATAGEM_{k.upper()}": str(v) for k, v in settings.items()})
        self._log = open(log_path, "ab")  # noqa: SIM115 (kept open for the process's lifetime)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "optimizer_service", "--port", str(self.port), "--log-level", "warning"],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.log_path = log_path

    def wait_healthy(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the service exited with {self.process.returncode}: {self.log()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the service never became healthy: {self.log()}")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self._log.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def processes_with(marker: str) -> list[int]:
    """Process ids whose command line contains `marker` (e.g. a test's scratch folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if marker in command and state != "Z":
            found.append(int(entry.name))
    return found
