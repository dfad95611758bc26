"""A real service process for tests that need one: `python -m optimizer_service` under uvicorn.

Used where only a real process shows the behaviour: `kill -9` mid-trial, many clients at once, an
event loop that must stay responsive. The environment is the test's, minus any Stratagem settings
the developer's shell may carry, plus what the test passes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.lib.serving import service_environment, wait_healthy
from stratagem.runtime.launch import free_port

ROOT = Path(__file__).resolve().parents[1]


class Served:
    """One service process on a free port; `kill()` is `kill -9`, `stop()` a graceful SIGTERM."""

    def __init__(self, database_url: str, log_path: Path, **settings: object) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # lower-case keys are service settings; upper-case ones plain environment variables (TMPDIR)
        variables = {k if k.isupper() else f"STRATAGEM_{k.upper()}": str(v) for k, v in settings.items()}
        env = service_environment(DATABASE_URL=database_url, **variables)
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
        wait_healthy(self.url, self.process, timeout_s=timeout_s, log=self.log)

    def post_watching_health(self, path: str, body: bytes) -> tuple[httpx.Response, float, list[float]]:
        """POST a JSON `body` while `/healthz` is polled every 20 ms, each poll asserted 200: the answer,
        the seconds it took, and every poll's latency."""
        answer: dict[str, Any] = {}

        def post() -> None:
            started = time.perf_counter()
            answer["response"] = httpx.post(
                f"{self.url}{path}", content=body, headers={"content-type": "application/json"}, timeout=240
            )
            answer["seconds"] = time.perf_counter() - started

        poster = threading.Thread(target=post)
        latencies: list[float] = []
        with httpx.Client(base_url=self.url, timeout=30) as http:
            poster.start()
            while poster.is_alive():
                started = time.perf_counter()
                assert http.get("/healthz").status_code == 200
                latencies.append(time.perf_counter() - started)
                time.sleep(0.02)
        poster.join()
        return answer["response"], answer["seconds"], latencies

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
